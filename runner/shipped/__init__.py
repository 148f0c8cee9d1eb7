"""The scripts a pull request ships, as real Python: each module here is the body of one generated file.

    text = render("bench", doc, {"BACKEND": "cuda", ...})          # pure: the file's text

The drop-in's own code is the package dropin/ here (its parts, read by runner/harness/dropin.py: that package's
docstring). A module here is linted and imported like the rest of fusebot (its tests call its functions). A generator
changes three things in it and nothing else:

- its docstring, replaced by the generated file's own (it names the PR's class and paths);
- the block of constants between `# ---- per-PR values` and `# ---- end of per-PR values`, one `NAME = value` a line:
  each value is written with repr, its trailing comment kept; the names given must be the block's names, no more, no
  fewer;
- an import line ending in `# fusebot: inline`: replaced by the named function's source (runner/harness/refs.py),
  since a shipped file runs where fusebot is not installed.
"""

from __future__ import annotations

import ast
from importlib import resources

from runner.harness.refs import inlined

BEGIN = "# ---- per-PR values"
END = "# ---- end of per-PR values"


def source(name: str) -> str:
    """The module `name` of this package as text (the resource the generators read)."""
    return resources.files(__name__).joinpath(f"{name}.py").read_text()


def block_names(name: str) -> list[str]:
    """The constants of `name`'s per-PR block, in order."""
    lines = source(name).splitlines(keepends=True)
    begin, end = _block(lines, name)
    return [_assignment(line)[0] for line in lines[begin + 1:end] if line.strip()]


def render(name: str, doc: str, values: dict[str, object]) -> str:
    """The shipped file made from module `name`: its docstring replaced by `doc` (the text inside the quotes), its
    per-PR block's constants set to `values` (repr), its inline import replaced by the function's source."""
    text = source(name)
    tree = ast.parse(text)
    first = tree.body[0]
    if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant) and isinstance(first.value.value,
                                                                                                     str)):
        raise ValueError(f"runner/shipped/{name}.py: no module docstring to replace")
    if '"""' in doc:
        raise ValueError("a shipped file's docstring may not hold triple quotes")
    lines = text.splitlines(keepends=True)
    lines = [f'"""{doc}"""\n'] + lines[first.end_lineno:]
    begin, end = _block(lines, name)
    block, seen = [], []
    for line in lines[begin + 1:end]:
        if not line.strip():
            block.append(line)
            continue
        const, comment = _assignment(line)
        if const not in values:
            raise KeyError(f"runner/shipped/{name}.py: no value given for {const}")
        seen.append(const)
        block.append(f"{const} = {values[const]!r}{comment}\n")
    extra = set(values) - set(seen)
    if extra:
        raise KeyError(f"runner/shipped/{name}.py: no constant {sorted(extra)} in its per-PR block")
    lines[begin + 1:end] = block
    return "".join(inlined(line) for line in lines)


def _block(lines: list[str], name: str) -> tuple[int, int]:
    begins = [i for i, line in enumerate(lines) if line.startswith(BEGIN)]
    ends = [i for i, line in enumerate(lines) if line.startswith(END)]
    if len(begins) != 1 or len(ends) != 1 or begins[0] > ends[0]:
        raise ValueError(f"runner/shipped/{name}.py: one per-PR block expected")
    return begins[0], ends[0]


def _assignment(line: str) -> tuple[str, str]:
    """(the constant a block line sets, its trailing comment with the spaces before it, or "")."""
    node = ast.parse(line.strip()).body[0]
    if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
        raise ValueError(f"a per-PR block holds `NAME = value` lines only: {line.strip()}")
    rest = line.rstrip("\n").encode()[node.end_col_offset or 0:].decode()  # the offset counts UTF-8 bytes
    return node.targets[0].id, rest if rest.strip().startswith("#") else ""
