"""Every module of runner/ has a test: test_<module>.py in the mirrored folder of tests/runner/, or a line of that
folder's __init__.py docstring ("name, name: the tests that cover them") naming the tests that cover it."""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "runner"


def runner_modules() -> list[tuple[str, ...]]:
    """Each module as its path under runner/ without the suffix; a package's __init__ holding code by the package."""
    out = []
    for path in sorted((ROOT / "runner").rglob("*.py")):
        parts = path.relative_to(ROOT / "runner").with_suffix("").parts
        if parts[-1] == "__init__":
            body = ast.parse(path.read_text()).body
            if len(parts) == 1 or all(isinstance(n, ast.Expr) and isinstance(n.value, ast.Constant) for n in body):
                continue  # runner itself, or a package whose __init__ holds only its docstring
            parts = parts[:-1]
        out.append(parts)
    return out


def covered(parts: tuple[str, ...]) -> bool:
    folder = TESTS.joinpath(*parts[:-1])
    if (folder / f"test_{parts[-1]}.py").is_file():
        return True
    init = folder / "__init__.py"
    lines = init.read_text().splitlines() if init.is_file() else []
    return any(parts[-1] in re.split(r"[\s,]+", line.split(":")[0].strip()) for line in lines if ":" in line)


def test_every_module_has_a_test_or_a_line_naming_the_one_that_covers_it():
    missing = ["runner/" + "/".join(p) for p in runner_modules() if not covered(p)]
    assert missing == [], f"no test_<module>.py and no line in the mirrored folder's __init__.py: {missing}"
