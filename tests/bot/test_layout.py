"""Layout rules: bot/ never imports torch or runner internals; the worker never imports PyGithub or FastAPI."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PROBE = """
import importlib, json, sys
for m in sys.argv[1:]:
    importlib.import_module(m)
print(json.dumps(sorted(sys.modules)))
"""


def modules_after_import(*names: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", PROBE, *names], cwd=ROOT, check=True, capture_output=True, text=True)
    return set(json.loads(out.stdout))


def test_bot_never_imports_torch_or_runner_internals():
    bot_modules = [f"bot.{p.stem}" for p in (ROOT / "bot").glob("*.py") if p.stem not in ("__init__", "demo", "action")]
    loaded = modules_after_import(*bot_modules, "bot.features")
    assert "bot.web.server" in loaded  # the probe imported what it should
    assert not any(m == "torch" or m.startswith("torch.") for m in loaded)
    assert {m for m in loaded if m.startswith("runner.")} <= {"runner.contract"}


def test_worker_never_imports_github_or_fastapi():
    loaded = modules_after_import("runner.cli.worker")
    assert "runner.cli.worker" in loaded
    assert not {m for m in loaded if m.split(".")[0] in ("github", "fastapi", "torch")}
