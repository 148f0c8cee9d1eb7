"""action.yml: parsed with PyYAML, its inputs and outputs as the README documents them, and its steps run as the
runner runs a composite action: `${{ }}` expressions resolved, each step's `env:` added to the environment GitHub
sets, `bash --noprofile --norc -eo pipefail` on the script, GITHUB_ACTION_PATH at this repository.

The install step is checked for syntax only (for real it would download fusebot's dependencies, and torch on a
runner without one); its result is stood in for by a virtualenv whose `fusebot` is this checkout. The fusebot step
runs for real in a subprocess against the fake GitHub; only the search inside it is replaced (a `sitecustomize`
that swaps `bot.action.search` for a fake returning real Verdicts)."""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot import pr
from runner.contract import TargetResult
from tests.bot.action_fake import ActionGitHub
from tests.bot.action_world import TOKEN, ActionWorld, make_action_world
from tests.bot.helpers import APP_ID, REPO, rsa_keys
from tests.bot.test_pr_body import improved_result, slow_result

ROOT = Path(__file__).resolve().parents[2]
ACTION = yaml.safe_load((ROOT / "action.yml").read_text())
EXPR = re.compile(r"\$\{\{\s*([^}]+?)\s*\}\}")

DOCUMENTED_INPUTS = {"label", "config-path", "budget", "models", "llm-api-key", "llm-base-url", "github-token",
                     "python"}
OUTPUTS = {"pr-number", "pr-url", "pr-numbers", "pr-urls", "best-speedup"}

SITECUSTOMIZE = '''
import os
from pathlib import Path

import bot.action
from runner.contract import Job, TargetResult
from tests.bot.action_world import fake_result


def fake_search(job: Job, source_dir, progress):
    Path(os.environ["FUSEBOT_TEST_JOB_SEEN"]).write_text(job.model_dump_json())
    load = lambda name: TargetResult.model_validate_json(Path(os.environ["FUSEBOT_TEST_RESULTS"], name).read_text())
    return fake_result(job, load("improved.json"), load("slow.json"))


bot.action.search = fake_search
'''


def resolve(text: str, context: dict[str, str]) -> str:
    """`${{ a.b }}` from a flat context; an unknown expression fails the test (it would be empty on GitHub)."""
    def one(m: re.Match[str]) -> str:
        assert m.group(1) in context, f"expression {m.group(0)} is not known to the test's context"
        return context[m.group(1)]

    return EXPR.sub(one, text)


def test_inputs_and_outputs_are_the_documented_ones():
    assert ACTION["runs"]["using"] == "composite"
    assert set(ACTION["inputs"]) == DOCUMENTED_INPUTS
    assert ACTION["inputs"]["github-token"]["default"] == "${{ github.token }}"
    assert ACTION["inputs"]["config-path"]["default"] == ".github/fusebot.yml"
    assert all(not i.get("required") and i.get("description") for i in ACTION["inputs"].values())
    assert set(ACTION["outputs"]) == OUTPUTS
    for name, out in ACTION["outputs"].items():
        assert out["value"] == f"${{{{ steps.fusebot.outputs.{name} }}}}"
    readme = (ROOT / "README.md").read_text()
    for name in DOCUMENTED_INPUTS | OUTPUTS:
        assert f"`{name}`" in readme, f"{name} is not documented in README.md"


def test_every_input_reaches_a_step_through_env_never_the_script():
    used: set[str] = set()
    for step in ACTION["runs"]["steps"]:
        assert step["shell"] == "bash"
        assert not EXPR.search(step["run"]), f"step {step['name']!r} pastes an expression into its script"
        for value in (step.get("env") or {}).values():
            used |= {e.removeprefix("inputs.") for e in EXPR.findall(str(value)) if e.startswith("inputs.")}
    assert used == DOCUMENTED_INPUTS


def test_the_install_step_is_valid_bash_and_reuses_the_runners_torch():
    install = next(s for s in ACTION["runs"]["steps"] if s["id"] == "install")
    subprocess.run(["bash", "-n"], input=install["run"], text=True, check=True)
    assert "--system-site-packages" in install["run"] and '"$GITHUB_ACTION_PATH"' in install["run"]


@pytest.fixture
def world(tmp_path: Path) -> Iterator[ActionWorld]:
    fake = ActionGitHub(APP_ID, rsa_keys()[1], tmp_path / "git")
    with fake.running():
        yield make_action_world(tmp_path, fake)
    assert fake.errors == [], "requests or responses outside GitHub's OpenAPI description"


def installed_venv(runner_temp: Path) -> None:
    """What the install step leaves: $RUNNER_TEMP/fusebot-venv/bin/fusebot, here running this checkout."""
    bin_dir = runner_temp / "fusebot-venv" / "bin"
    bin_dir.mkdir(parents=True)
    (bin_dir / "fusebot").write_text(f'#!/bin/sh\nexec "{sys.executable}" -m bot.cli "$@"\n')
    (bin_dir / "fusebot").chmod(0o755)


def test_the_fusebot_step_runs_for_real_on_a_labelled_pr(world: ActionWorld, tmp_path: Path):
    w = world
    w.checkout(w.shas["feature"])
    env = w.event("pull_request", w.labeled())
    installed_venv(Path(env["RUNNER_TEMP"]))
    hooks, results = tmp_path / "hooks", tmp_path / "results"
    hooks.mkdir()
    results.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (results / "improved.json").write_text(improved_result().model_dump_json())
    (results / "slow.json").write_text(slow_result().model_dump_json())
    inputs = {name: spec.get("default", "") for name, spec in ACTION["inputs"].items()}
    context = {"github.token": TOKEN, "runner.temp": env["RUNNER_TEMP"],
               **{f"inputs.{k}": resolve(v, {"github.token": TOKEN}) for k, v in inputs.items()}}
    step = next(s for s in ACTION["runs"]["steps"] if s["id"] == "fusebot")
    step_env: dict[str, Any] = {
        "PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **env,
        "GITHUB_ACTION_PATH": str(ROOT), "FUSEBOT_GITHUB_REQUEST_INTERVAL_SECONDS": "0",
        "FUSEBOT_GITHUB_WRITE_INTERVAL_SECONDS": "0",
        "PYTHONPATH": f"{hooks}:{ROOT}", "FUSEBOT_TEST_RESULTS": str(results),
        "FUSEBOT_TEST_JOB_SEEN": str(tmp_path / "job.json"),
        **{k: resolve(str(v), context) for k, v in step["env"].items()},
    }
    assert step_env["FUSEBOT_GITHUB_TOKEN"] == TOKEN and step_env["FUSEBOT_LABEL"] == ""
    proc = subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", step["run"]], cwd=w.workspace,
                          env=step_env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "job.json").exists()  # the search ran (the fake), on the job the step built
    [pull] = w.fake.bot_pulls(REPO)
    outputs = w.outputs()
    context.update({f"steps.fusebot.outputs.{k}": v for k, v in outputs.items()})
    action_outputs = {name: resolve(out["value"], context) for name, out in ACTION["outputs"].items()}
    assert action_outputs["pr-number"] == str(pull.number)
    assert action_outputs["pr-url"] == f"https://github.com/{REPO}/pull/{pull.number}"
    improved = TargetResult.model_validate_json((results / "improved.json").read_text())
    assert action_outputs["best-speedup"] == f"{pr.speedup(improved.verdict):.4g}"
    assert f"#{pull.number}" in w.summary.read_text()
    assert TOKEN not in proc.stdout + proc.stderr + w.summary.read_text() + w.output.read_text()


def _workflow(path: Path) -> dict[str, Any]:
    d = yaml.safe_load(path.read_text())
    d["on"] = d.pop(True, d.get("on"))  # YAML 1.1 reads the key `on` as true
    return d


@pytest.mark.parametrize("name,events", [("fusebot-label.yml", {"pull_request"}),
                                         ("fusebot-nightly.yml", {"schedule", "workflow_dispatch"})])
def test_example_workflows_use_the_action_on_a_gpu_runner_with_the_permissions_it_needs(name: str, events: set):
    path = ROOT / ".github" / "examples" / name
    wf = _workflow(path)
    assert set(wf["on"]) == events
    assert wf["permissions"] == {"contents": "write", "pull-requests": "write", "checks": "write"}
    [job] = wf["jobs"].values()
    assert job["runs-on"] == ["self-hosted", "gpu"]
    [step] = [s for s in job["steps"] if s.get("uses", "").startswith("fusebot/fusebot@")]
    assert set(step.get("with") or {}) <= DOCUMENTED_INPUTS
    checkout = next(s for s in job["steps"] if s.get("uses", "").startswith("actions/checkout@"))
    assert checkout["with"]["persist-credentials"] is False
    if "pull_request" in events:
        assert wf["on"]["pull_request"]["types"] == ["labeled"]
        assert checkout["with"]["ref"] == "${{ github.event.pull_request.head.sha }}"
        text = path.read_text()
        assert "pull_request_target" in text and "fork" in text and "label" in text  # the safety spelled out


def test_only_this_repositorys_ci_runs_here():
    """Workflows under .github/workflows/ run as this repository's CI: the user examples must not be there."""
    assert sorted(p.name for p in (ROOT / ".github" / "workflows").iterdir()) == ["ci.yml"]
    ci = _workflow(ROOT / ".github" / "workflows" / "ci.yml")
    [job] = ci["jobs"].values()
    assert job["runs-on"] == "ubuntu-latest" and any(s.get("run") == "bash .ci/run" for s in job["steps"])
