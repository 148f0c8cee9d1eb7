"""The house rules of bot/ and runner/, checked on the source tree.

- No import circle: every module imports first in a clean interpreter state (no project module loaded before it).
- Imports point down. Each package of a tower has a rank; a module may import its own package and packages of a
  lower rank, never one of the same or a higher rank. runner/, from the bottom:
      errors, dtypes, version < contract < harness < search, catalog < results, proposers < pipeline < cli
  (the harness builds, verifies and times; search is the loop and the Proposer interface; catalog is the IR and the
  code generators; results turn verdicts into files; proposers bring ideas from the catalog or an LLM; pipeline is
  the one path from a problem to its result folder; cli are the typer shells.) bot/, from the bottom:
      logs, web.settings, web.metrics < repo < github < store < publish < context < features < web, action, demo < cli
  bot/ imports runner.contract (the schema between the towers) and runner.version (the version both state) only,
  except bot.demo and bot.action, which run the search in their own process; they too never load torch when imported
  (only when a search runs).
  Imports under `if TYPE_CHECKING:` are annotations, not dependencies, and are not counted.
  (tests/bot/test_layout.py checks, by loading them, that bot/ never loads torch or runner internals and the
  runner's worker never loads PyGithub or FastAPI.)
- No module over 400 lines, unless it stays one concept, with the reason in LONG_REASONS.
- No project import inside a function unless its line carries a reason comment (`# ...`).
- The kernel ABI's dtype codes have one source (runner/dtypes.py): the C header's enum, the harness's torch map, the
  catalog's generated checks and the drop-in's guard all say the same.
- Every test file or folder a tests package's docstring names (as covering a module) exists: a name is found beside
  that __init__.py, from the repository's root (tests/...), or beside the file the docstring named just before it.

The allow-lists below name what breaks a rule today; each must only shrink. A failure prints the list to edit.
"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TOWERS = ("bot", "runner")
MAX_LINES = 400

RANKS = {
    "runner.errors": 0,
    "runner.dtypes": 0,
    "runner.version": 0,
    "runner.stored": 0,
    "runner.contract": 1,
    "runner.harness": 2,
    "runner.search": 3,
    "runner.catalog": 3,
    "runner.shipped": 3,
    "runner.results": 4,
    "runner.proposers": 4,
    "runner.pipeline": 5,
    "runner.cli": 6,
    "bot.logs": 0,
    "bot.web.settings": 0,
    "bot.web.metrics": 0,
    "bot.repo": 1,
    "bot.github": 2,
    "bot.store": 3,
    "bot.publish": 4,
    "bot.context": 5,
    "bot.features": 6,
    "bot.web": 7,
    "bot.action": 7,
    "bot.demo": 7,
    "bot.cli": 8,
}
# These bot packages may import any of runner/ (they run the search in their own process).
RUNS_THE_SEARCH = ("bot.demo", "bot.action")

# "importer -> imported package" edges that point up or sideways today.
UPWARD_ALLOWED: set[str] = set()
# Modules over MAX_LINES, each one concept that a split would scatter (the reason beside it).
LONG_REASONS: dict[str, str] = {
    "runner/contract.py": "the schema between the towers: every model a verdict, a job and a result is made of",
    "runner/catalog/recognition.py": "lowering one captured ATen graph to the IR: one dispatch over the graph's ops",
    "runner/pipeline.py": "one problem from its file to its result folder under one budget, and a job's targets",
    "runner/harness/procs/judge.py": "the judge process: its state and the handlers of the parent's requests",
    "runner/results/files.py": "a result folder's files for one target: what ships, written in one place",
    "runner/catalog/codegen/cuda/regs.py": "the register-resident row kernel: its layout, loads ahead and template",
}
LONG_ALLOWED: set[str] = set(LONG_REASONS)
# "path: imported module" for project imports inside a function without a reason comment today.
INNER_ALLOWED: set[str] = {
    "bot/action/entry.py: runner.proposers.llm.proposer",
    "bot/demo.py: runner.harness.evaluator",
    "bot/demo.py: runner.pipeline",
    "bot/demo.py: runner.proposers.catalog",
    "bot/demo.py: runner.proposers.seed",
    "bot/demo.py: runner.results.files",
    "bot/demo.py: runner.results.outcome",
    "runner/catalog/capture.py: runner.harness.problem",
    "runner/catalog/capture.py: runner.harness.sandbox",
    "runner/harness/procs/judge.py: runner.harness.build",
    "runner/harness/procs/judge.py: runner.harness.procs.profile",
    "runner/harness/verify.py: runner.harness.procs",
}


def modules(tower: str) -> list[tuple[str, Path]]:
    out = []
    for path in sorted((ROOT / tower).rglob("*.py")):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
        out.append((".".join(parts), path))
    return out


ALL = [m for tower in TOWERS for m in modules(tower)]


def unit(module: str) -> str:
    """The ranked package a module belongs to (the longest prefix in RANKS), or the module itself."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        if ".".join(parts[:n]) in RANKS:
            return ".".join(parts[:n])
    return module


def imports(module: str, path: Path) -> list[tuple[str, int, bool]]:
    """(imported module, line, inside a function) for each project import, TYPE_CHECKING blocks left out."""
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    found: list[tuple[str, int, bool]] = []

    def visit(node: ast.AST, in_function: bool) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.If) and "TYPE_CHECKING" in ast.unparse(child.test):
                for sub in child.orelse:
                    visit(ast.Module(body=[sub], type_ignores=[]), in_function)
                continue
            if isinstance(child, ast.Import):
                names = [a.name for a in child.names]
            elif isinstance(child, ast.ImportFrom):
                base = package.split(".")[: len(package.split(".")) - child.level + 1] if child.level else []
                names = [".".join([*base, child.module] if child.module else base)]
            else:
                visit(child, in_function or isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)))
                continue
            found.extend((n, child.lineno, in_function) for n in names if n.split(".")[0] in TOWERS)

    visit(tree, False)
    return found


def test_every_module_imports_on_its_own():
    """Each module is imported with no project module loaded before it: an import circle fails as an ImportError."""
    probe = """
import importlib, json, sys, traceback
failed = {}
for name in sys.argv[1:]:
    for loaded in [m for m in sys.modules if m.split(".")[0] in ("bot", "runner")]:
        del sys.modules[loaded]
    try:
        importlib.import_module(name)
    except Exception:
        failed[name] = traceback.format_exc(limit=-3)
print(json.dumps(failed))
"""
    names = [name for name, _ in ALL]
    done = subprocess.run([sys.executable, "-c", probe, *names], cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert not failed, "\n\n".join(f"{name}:\n{tb}" for name, tb in failed.items())


def test_every_module_is_ranked():
    unranked = sorted(name for name, _ in ALL if name not in TOWERS and unit(name) == name and name not in RANKS)
    assert not unranked, f"give these a rank in RANKS (tests/test_layout.py): {unranked}"


def test_imports_point_down():
    found: set[str] = set()
    for name, path in ALL:
        mine = unit(name)
        for target, *_ in imports(name, path):
            theirs = unit(target)
            if theirs == mine or name in TOWERS or target in TOWERS:
                continue
            if mine.startswith("bot.") and theirs.startswith("runner."):
                if theirs in ("runner.contract", "runner.version") or mine in RUNS_THE_SEARCH:
                    continue
                found.add(f"{name} -> {theirs}")  # bot/ reaching past the contract
            elif RANKS.get(theirs, 99) >= RANKS.get(mine, -1):
                found.add(f"{name} -> {theirs}")
    new, gone = found - UPWARD_ALLOWED, UPWARD_ALLOWED - found
    assert not new, f"imports that point up or sideways (the order is in this file's docstring): {sorted(new)}"
    assert not gone, f"fixed: remove from UPWARD_ALLOWED in tests/test_layout.py: {sorted(gone)}"


def test_no_module_is_over_400_lines():
    long = {str(path.relative_to(ROOT)): len(path.read_text().splitlines()) for _, path in ALL}
    over = {p for p, n in long.items() if n > MAX_LINES}
    new, gone = over - LONG_ALLOWED, LONG_ALLOWED - over
    assert not new, f"modules over {MAX_LINES} lines: {sorted((p, long[p]) for p in new)}; allowed: {sorted(LONG_ALLOWED)}"
    assert not gone, f"now {MAX_LINES} lines or fewer: remove from LONG_ALLOWED in tests/test_layout.py: {sorted(gone)}"


def test_project_imports_inside_functions_say_why():
    found: set[str] = set()
    for name, path in ALL:
        lines = path.read_text().splitlines()
        for target, line, in_function in imports(name, path):
            if in_function and "#" not in lines[line - 1]:
                found.add(f"{path.relative_to(ROOT)}: {target}")
    new, gone = found - INNER_ALLOWED, INNER_ALLOWED - found
    assert not new, ("a project import inside a function needs a reason comment on its line, e.g. `# torch: only "
                     f"when the search runs here` (or move it to the top): {sorted(new)}")
    assert not gone, f"fixed: remove from INNER_ALLOWED in tests/test_layout.py: {sorted(gone)}"


@pytest.mark.parametrize("text", ["import runner.harness.timing", "from runner.harness import timing",
                                  "from .harness import timing"])
def test_the_checker_sees_an_import_inside_a_function_however_spelled(tmp_path, text):
    path = tmp_path / "contract.py"
    path.write_text(f"def f():\n    {text}  \n")
    ((target, line, in_function),) = imports("runner.contract", path)
    assert (unit(target), line, in_function) == ("runner.harness", 2, True)
    assert RANKS[unit(target)] > RANKS["runner.contract"]  # so test_imports_point_down would name it


def test_the_checker_leaves_out_type_checking_imports(tmp_path):
    path = tmp_path / "contract.py"
    path.write_text("from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from runner.harness import timing\n")
    assert imports("runner.contract", path) == []


def test_the_abi_dtype_codes_have_one_source():
    import re

    import torch

    from runner.catalog.codegen.head import DTYPE_CODE
    from runner.dtypes import ABI_DTYPES
    from runner.harness.dropin import part
    from runner.harness.procs.abi import DTYPE_CODES

    header = (ROOT / "runner/csrc/fusebot.h").read_text()
    enum = re.search(r"enum fb_dtype \{(.*?)\};", header, re.S).group(1)
    assert {name.lower(): int(code) for name, code in re.findall(r"FB_(\w+) = (\d+)", enum)} == ABI_DTYPES
    assert {str(t).removeprefix("torch."): code for t, code in DTYPE_CODES.items()} == ABI_DTYPES
    assert DTYPE_CODE == ABI_DTYPES
    table = re.search(r"^_DTYPES = (\{.*?\})$", part("guard"), re.M | re.S).group(1)
    assert eval(table, {"torch": torch}) == DTYPE_CODES  # noqa: S307 - fusebot's own generated literal


def named_tests(init: Path) -> list[tuple[str, bool]]:
    """(name, exists) for each test file or tests/ folder the docstring of a tests package's __init__.py names."""
    doc = ast.get_docstring(ast.parse(init.read_text())) or ""
    out, last = [], init.parent
    for name in re.findall(r"[\w./-]+\.py\b|tests/[\w/]+/", doc):
        if not (name.startswith("tests/") or Path(name).name.startswith("test_")):
            continue  # a module of the source tree, not a test
        found = next((p for p in (ROOT / name, init.parent / name, last / name) if p.exists()), None)
        out.append((name, found is not None))
        last = found.parent if found is not None and found.is_file() else last
    return out


def test_every_test_a_tests_package_names_exists():
    missing = [f"{init.relative_to(ROOT)}: {name}" for init in sorted((ROOT / "tests").rglob("__init__.py"))
               for name, exists in named_tests(init) if not exists]
    assert not missing, f"named as covering a module, but not there (rename or remove the name): {missing}"


def test_the_named_tests_checker_reads_a_name_beside_the_one_before(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "test_one.py").write_text("")
    (tmp_path / "a" / "test_two.py").write_text("")
    init = tmp_path / "__init__.py"
    init.write_text('"""m: a/test_one.py and test_two.py; n: test_three.py; o: source/module.py"""\n')
    assert named_tests(init) == [("a/test_one.py", True), ("test_two.py", True), ("test_three.py", False)]
