"""Layout rules: bot/ never imports torch or runner internals; its layers import only downwards; the worker never
imports PyGithub or FastAPI. (This module also covers bot/cli.py and bot/context.py, which the probe imports.)"""

from __future__ import annotations

import ast
import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TESTS = ROOT / "tests" / "bot"
PROBE = """
import importlib, json, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
print(json.dumps(sorted(sys.modules)))
"""
# Each package of bot/ may import from these packages of bot/ (and from itself), never from the others.
MAY_IMPORT = {
    "github": set(),
    "store": {"github"},  # the inbox stores webhook events (bot.github.webhooks)
    "repo": {"logs"},
    "publish": {"github", "store", "repo", "logs"},
    "features": {"github", "store", "repo", "publish", "context", "logs"},
    "web": {"github", "store", "repo", "publish", "features", "context", "logs"},
    "action": {"github", "repo", "publish", "logs"},
}


def modules_after_import(*names: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def bot_modules() -> list[str]:
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in (ROOT / "bot").rglob("*.py")
                  if p.stem != "__init__")


def test_bot_never_imports_torch_or_runner_internals():
    loaded = modules_after_import(*[m for m in bot_modules() if m != "bot.demo"])
    assert "bot.web.server" in loaded and "bot.action.entry" in loaded  # the probe imported what it should
    assert not any(m == "torch" or m.startswith("torch.") for m in loaded)
    assert {m for m in loaded if m.startswith("runner.")} <= {"runner.contract", "runner.version"}


@pytest.mark.parametrize("package", sorted(MAY_IMPORT))
def test_imports_point_down(package: str):
    """Module-level imports only (an import under `if TYPE_CHECKING:` names a type, and loads nothing)."""
    wrong = []
    for path in sorted((ROOT / "bot" / package).rglob("*.py")):
        for node in ast.parse(path.read_text()).body:
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("bot."):
                target = node.module.split(".")[1]
                if target != package and target not in MAY_IMPORT[package]:
                    wrong.append(f"{path.relative_to(ROOT)}: {node.module}")
    assert wrong == []


def test_every_module_has_a_test_or_a_line_naming_the_one_that_covers_it():
    missing = []
    for module in bot_modules():
        parts = module.split(".")[1:]
        folder = TESTS.joinpath(*parts[:-1])
        covered = (folder / f"test_{parts[-1]}.py").is_file() or any(
            parts[-1] in re.split(r"[\s,:]+", line.split(":")[0])
            for line in ((folder / "__init__.py").read_text() if (folder / "__init__.py").is_file() else "").splitlines()
            if ":" in line)
        if not covered:
            missing.append(module)
    assert missing == []


def test_worker_never_imports_github_or_fastapi():
    loaded = modules_after_import("runner.cli.worker")
    assert "runner.cli.worker" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("github", "fastapi", "torch")}
