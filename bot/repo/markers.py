"""Source markers: `# fusebot: optimize` on the line above a class, with get_inputs/get_init_inputs beside it.

A dependency-free scan (ast only) for the demo and the device bench scripts; the App's discovery (bot/repo/discovery.py)
does the same on a clone, with the repository config.
"""

from __future__ import annotations

import ast
import logging
from pathlib import Path

from runner.contract import TargetSpec

log = logging.getLogger(__name__)

MARKER = "# fusebot: optimize"


def discover(root: Path) -> list[TargetSpec]:
    """Classes with `# fusebot: optimize` on the line above, in files that define get_inputs and get_init_inputs."""
    targets = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if any(part.startswith(".") or part in ("fusebot_kernels", "__pycache__") for part in rel.parts):
            continue
        text = path.read_text()
        if MARKER not in text:
            continue
        tree = ast.parse(text)
        funcs = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        if not {"get_inputs", "get_init_inputs"} <= funcs:
            log.warning("%s: marked, but get_inputs/get_init_inputs are missing; skipped", rel)
            continue
        lines = text.splitlines()
        for node in tree.body:
            first = min([node.lineno] + [d.lineno for d in getattr(node, "decorator_list", [])])
            if isinstance(node, ast.ClassDef) and first >= 2 and lines[first - 2].strip() == MARKER:
                targets.append(TargetSpec(name=node.name, file=rel.as_posix(), class_name=node.name,
                                          second_inputs="get_second_inputs" if "get_second_inputs" in funcs else None))
    return targets
