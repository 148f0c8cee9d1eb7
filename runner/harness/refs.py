"""A problem's references to its factories: a name in the problem's own module, or `package.module:name`.

`resolve` is the one implementation. The harness calls it; the files a pull request ships (the drop-in, its test, the
bench script) run where fusebot is not installed, so they carry its source text (`resolve_source`), not an import:
it is written for them (no annotations, nothing but `importlib`).
"""

from __future__ import annotations

import ast
import importlib
import inspect

INLINE = "# fusebot: inline"


def resolve(module, ref):
    """`ref` in `module`, or `package.module:name` imported; AttributeError or ImportError when it is not there."""
    if ":" in ref:
        name, attr = ref.split(":", 1)
        return getattr(importlib.import_module(name), attr)
    return getattr(module, ref)


def resolve_source(name: str = "_resolve") -> str:
    """`resolve`'s source text, the function named `name` (a generated file's private helper)."""
    return inspect.getsource(resolve).replace("def resolve(", f"def {name}(", 1)


def inlined(line: str) -> str:
    """An import marked `# fusebot: inline` (`from runner.harness.refs import resolve as _resolve`) as the function's
    source under the name it is imported as, with blank lines around it; any other line as it is."""
    if not line.rstrip().endswith(INLINE):
        return line
    node = ast.parse(line.strip()).body[0]
    if not (isinstance(node, ast.ImportFrom) and node.module == "runner.harness.refs" and len(node.names) == 1
            and node.names[0].name == "resolve"):
        raise ValueError(f"only refs.resolve is inlined: {line.strip()}")
    return "\n" + resolve_source(node.names[0].asname or "resolve") + "\n"
