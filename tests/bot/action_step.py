"""action.yml's steps run as the runner runs a composite action: `${{ }}` expressions resolved from a flat context,
each step's `env:` added to the environment GitHub sets, `bash --noprofile --norc -eo pipefail` on the script,
GITHUB_ACTION_PATH at this repository.

The install step is not run (for real it would download fusebot's dependencies, and torch on a runner without one);
what it leaves, `$RUNNER_TEMP/fusebot-venv/bin/fusebot`, is stood in for by a script that runs this checkout."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml

from tests.bot.action_world import TOKEN, ActionWorld

ROOT = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")


def resolve(text: str, context: dict[str, str]) -> str:
    """`${{ a.b }}` from a flat context; an unknown expression fails the test (it would be empty on GitHub)."""
    def one(m: re.Match[str]) -> str:
        assert m.group(1) in context, f"expression {m.group(0)} is not known to the test's context"
        return context[m.group(1)]

    return EXPR.sub(one, text)


def step(step_id: str) -> dict[str, Any]:
    return next(s for s in ACTION["runs"]["steps"] if s["id"] == step_id)


def installed_venv(runner_temp: Path) -> None:
    """What the install step leaves: $RUNNER_TEMP/fusebot-venv/bin/fusebot, here running this checkout."""
    bin_dir = runner_temp / "fusebot-venv" / "bin"
    bin_dir.mkdir(parents=True, exist_ok=True)
    (bin_dir / "fusebot").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bot.cli "$@"\n')
    (bin_dir / "fusebot").chmod(0o755)


def context_for(env: dict[str, str], **inputs: str) -> dict[str, str]:
    """The expression context of a run: the inputs' defaults (or `inputs`), github.token, runner.temp."""
    values = {name: inputs.get(name, spec.get("default", "")) for name, spec in ACTION["inputs"].items()}
    assert set(inputs) <= set(values), f"not inputs of action.yml: {set(inputs) - set(values)}"
    return {"github.token": TOKEN, "runner.temp": env["RUNNER_TEMP"],
            **{f"inputs.{k}": resolve(str(v), {"github.token": TOKEN}) for k, v in values.items()}}


def run_fusebot_step(w: ActionWorld, env: dict[str, str], context: dict[str, str], extra_env: dict[str, str],
                     timeout: float) -> subprocess.CompletedProcess[str]:
    """The `fusebot` step of action.yml, for real, in the checked-out workspace."""
    installed_venv(Path(env["RUNNER_TEMP"]))
    s = step("fusebot")
    step_env: dict[str, Any] = {
        "PATH": "/usr/local/bin:/usr/bin:/bin", "HOME": str(w.tmp), **env, "GITHUB_ACTION_PATH": str(ROOT),
        "FUSEBOT_GITHUB_REQUEST_INTERVAL_SECONDS": "0", "FUSEBOT_GITHUB_WRITE_INTERVAL_SECONDS": "0",
        **extra_env, **{k: resolve(str(v), context) for k, v in s["env"].items()},
    }
    return subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", s["run"]], cwd=w.workspace,
                          env=step_env, capture_output=True, text=True, timeout=timeout)


def action_outputs(w: ActionWorld, context: dict[str, str]) -> dict[str, str]:
    """The action's outputs as a workflow reads them (`steps.<id>.outputs.<name>`): action.yml's `outputs:` resolved
    against what the step wrote to GITHUB_OUTPUT."""
    ctx = {**context, **{f"steps.fusebot.outputs.{k}": v for k, v in w.outputs().items()}}
    return {name: resolve(out["value"], ctx) for name, out in ACTION["outputs"].items()}
