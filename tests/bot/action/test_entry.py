"""`fusebot action` driven as GitHub Actions drives it: the real `pull_request.labeled` payload (and `schedule` and
`workflow_dispatch` payloads written after GitHub's docs), the environment GitHub sets for each trigger, a checkout
of a local bare repository as the workspace, and the fake GitHub (real HTTP, OpenAPI-validated) behind PyGithub.
The search is replaced by a fake `run_job` that returns real Verdicts (the harness is tested elsewhere)."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

import bot.action.entry
from bot import cli
from bot.github.platform import PlatformError, find_marker
from bot.publish.plan import branch_name
from bot.publish.verdicts import speedup, target_table
from runner.contract import ExitStatus, Job, JobResult
from tests.bot.action_fake import ActionGitHub
from tests.bot.action_world import (
    TOKEN,
    ActionWorld,
    dispatch_payload,
    fake_result,
    make_action_world,
    schedule_payload,
)
from tests.bot.helpers import APP_ID, REPO, pr_payload, rsa_keys
from tests.bot.results import improved_result, slow_result
from tests.bot.test_layout import modules_after_import

REAL_SEARCH = bot.action.entry.search
LLM_KEY = "sk-test-llm-key-0123456789abcdef"
FAST_GITHUB = {"FUSEBOT_GITHUB_REQUEST_INTERVAL_SECONDS": "0", "FUSEBOT_GITHUB_WRITE_INTERVAL_SECONDS": "0"}


@pytest.fixture
def world(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[ActionWorld]:
    fake = ActionGitHub(APP_ID, rsa_keys()[1], tmp_path / "git")
    with fake.running():
        w = make_action_world(tmp_path, fake)
        improved, slow = improved_result(), slow_result()

        def fake_run_job(job: Job, source_dir: Path, progress) -> JobResult:
            assert Path(source_dir) == w.workspace
            w.jobs.append(job)
            w.environ_seen = dict(os.environ)  # what a search (and every candidate it starts) would inherit
            w.results.append(fake_result(job, improved, slow))
            return w.results[-1]

        monkeypatch.setattr(bot.action.entry, "search", fake_run_job)
        yield w
    assert fake.errors == [], "requests or responses outside GitHub's OpenAPI description"


def run_action(w: ActionWorld, env: dict[str, str], **inputs: str):
    """One workflow run: fresh summary and output files, the action step's environment, `fusebot action`."""
    for f in (w.summary, w.output):
        f.unlink(missing_ok=True)
    step_env = {**env, "FUSEBOT_GITHUB_TOKEN": TOKEN, "FUSEBOT_LABEL": "", **FAST_GITHUB, **inputs}
    return CliRunner().invoke(cli.app, ["action"], env=step_env, catch_exceptions=False)


def bot_prs(w: ActionWorld):
    return w.fake.bot_pulls(REPO)


def test_a_labelled_pr_gets_one_pr_into_its_branch_opened_then_updated(world: ActionWorld):
    w = world
    w.checkout(w.shas["feature"])
    env = w.event("pull_request", w.labeled())
    first = run_action(w, env)
    assert first.exit_code == 0, first.output
    [job] = w.jobs
    assert [t.name for t in job.targets] == ["models.attn.Attention"]  # only what the PR changed
    assert (job.sha, job.ref, job.trigger, job.pr_number) == (w.shas["feature"], "feature", "label", 2)
    [pull] = bot_prs(w)
    assert (pull.head_ref, pull.base_ref) == ("fusebot/feature/models.attn.attention", "feature")
    assert find_marker(pull.body, "pr") == "feature/models.attn.attention"
    files = w.fake.files_at(REPO, pull.head_ref)
    result = w.results[0].targets[0]
    for rel, content in result.files.items():
        assert files[f"fusebot_kernels/{rel}"] == content
    assert files["models/attn.py"] == (w.workspace / "models/attn.py").read_text()  # on the PR's own head
    [run] = w.fake.check_run_list()
    assert (run["head_sha"], run["status"], run["conclusion"]) == (w.shas["feature"], "completed", "success")
    [status] = w.fake.comments_on(REPO, 2)
    assert f"https://github.com/{REPO}/pull/{pull.number}" in status
    out = w.outputs()
    best = speedup(result.verdict)
    url = f"https://github.com/{REPO}/pull/{pull.number}"
    assert out == {"pr-number": str(pull.number), "pr-url": url, "pr-numbers": f"[{pull.number}]",
                   "pr-urls": f'["{url}"]', "best-speedup": f"{best:.4g}"}
    summary = w.summary.read_text()
    assert f"Pull request [#{pull.number}]" in summary and target_table(result) in summary

    again = run_action(w, env)
    assert again.exit_code == 0, again.output
    assert len(bot_prs(w)) == 1 and w.outputs()["pr-number"] == str(pull.number)  # updated, not duplicated
    assert len(w.fake.comments_on(REPO, 2)) == 1  # the status comment edited in place
    assert w.fake.calls_to("PATCH", f"/pulls/{pull.number}")


def test_a_fork_pr_gets_the_patch_as_a_comment_and_nothing_is_pushed(world: ActionWorld):
    w = world
    w.checkout(w.shas["feature"])
    refs_before = w.fake.refs(REPO)
    res = run_action(w, w.event("pull_request_target", w.labeled(fork=True)))
    assert res.exit_code == 0, res.output
    assert len(w.jobs) == 1 and bot_prs(w) == []
    assert w.fake.refs(REPO) == refs_before  # no branch, no commit
    assert w.fake.calls_to("POST", "/git/") == []
    first, *parts = w.fake.comments_on(REPO, 2)  # the results, then the patch's other parts (whole files each)
    assert "git apply fusebot" in first and all("new file mode 100644" in c for c in [first, *parts])
    assert all(f"part {k} of {1 + len(parts)}" in c for k, c in enumerate(parts, 2))
    out = w.outputs()
    best = speedup(w.results[0].targets[0].verdict)  # the measured one (on a loaded CPU it may be < 1)
    assert out == {"pr-number": "", "pr-url": "", "pr-numbers": "[]", "pr-urls": "[]", "best-speedup": f"{best:.4g}"}
    assert "a fork: nothing pushed" in w.summary.read_text()


@pytest.mark.parametrize("label", ["bug", "Optimize-Kernels"])
def test_another_label_does_nothing(world: ActionWorld, label: str):
    w = world
    w.checkout(w.shas["feature"])
    res = run_action(w, w.event("pull_request", w.labeled(label=label)))
    assert res.exit_code == 0, res.output
    assert w.jobs == [] and w.fake.calls == []  # not one request to GitHub
    assert "nothing to do" in w.summary.read_text() and f"label `{label}` added" in w.summary.read_text()
    assert w.outputs() == {"pr-number": "", "pr-url": "", "pr-numbers": "[]", "pr-urls": "[]", "best-speedup": ""}


@pytest.mark.parametrize("action", ["opened", "synchronize", "unlabeled"])
def test_other_pull_request_actions_do_nothing_whatever_the_workflow_listens_to(world: ActionWorld, action: str):
    w = world
    w.checkout(w.shas["feature"])
    payload = pr_payload(action, number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"])
    if "label" in payload:
        payload["label"]["name"] = "optimize-kernels"  # even removing the trigger label starts nothing
    res = run_action(w, w.event("pull_request_target", payload))
    assert res.exit_code == 0, res.output
    assert w.jobs == [] and w.fake.calls == []
    assert f"`{action}`: fusebot runs only when a PR is labelled" in w.summary.read_text()


def test_the_label_input_replaces_the_default(world: ActionWorld):
    w = world
    w.checkout(w.shas["feature"])
    res = run_action(w, w.event("pull_request", w.labeled(label="fuse-me")), FUSEBOT_LABEL="fuse-me")
    assert res.exit_code == 0, res.output
    assert len(w.jobs) == 1 and len(bot_prs(w)) == 1


def test_schedule_searches_every_marked_target_on_the_default_branch(world: ActionWorld):
    w = world
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("schedule", schedule_payload()), FUSEBOT_BUDGET_SECONDS="120")
    assert res.exit_code == 0, res.output
    [job] = w.jobs
    assert sorted(t.name for t in job.targets) == ["models.attn.Attention", "models.mlp.MLP"]
    assert (job.sha, job.ref, job.trigger, job.pr_number, job.budget.wall_seconds) == (
        w.shas["main"], "main", "schedule", None, 120.0)
    [pull] = bot_prs(w)  # per-target grouping: only the improved target gets a PR
    assert (pull.base_ref, pull.head_ref) == ("main", "fusebot/main/models.attn.attention")
    assert "(schedule)" in pull.body
    assert w.fake.comments == {}  # no PR to comment on


def test_per_target_prs_are_all_in_the_outputs_and_the_best_speedup_is_over_all(world: ActionWorld,
                                                                                monkeypatch: pytest.MonkeyPatch):
    """Two improved targets, per-target grouping: two PRs. pr-number/pr-url name the first (in the targets' order),
    pr-numbers/pr-urls list both as JSON, best-speedup is the better of the two whichever PR it is in."""
    w = world
    improved = improved_result()
    timing = improved.verdict.timing
    faster = improved.model_copy(update={"verdict": improved.verdict.model_copy(update={
        "timing": timing.model_copy(update={"median_ms": timing.median_ms / 2})})})

    def two_improved(job: Job, source_dir: Path, progress) -> JobResult:
        w.jobs.append(job)
        first, second = fake_result(job, improved, improved).targets  # job order: attn, then mlp
        second = second.model_copy(update={"verdict": faster.verdict})
        w.results.append(JobResult(job_id=job.id, ok=True, targets=[first, second],
                                   environment=improved.verdict.environment))
        return w.results[-1]

    monkeypatch.setattr(bot.action.entry, "search", two_improved)
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("schedule", schedule_payload()))
    assert res.exit_code == 0, res.output
    [job] = w.jobs
    pulls = {p.head_ref: p for p in bot_prs(w)}
    names = [t.name for t in job.targets]
    assert sorted(pulls) == sorted(branch_name("main", n) for n in names)
    ordered = [pulls[branch_name("main", n)] for n in names]
    urls = [f"https://github.com/{REPO}/pull/{p.number}" for p in ordered]
    out = w.outputs()
    assert (out["pr-number"], out["pr-url"]) == (str(ordered[0].number), urls[0])
    assert json.loads(out["pr-numbers"]) == [p.number for p in ordered] and json.loads(out["pr-urls"]) == urls
    speedups = [speedup(r.verdict) for r in w.results[0].targets]
    assert speedups[1] > speedups[0]  # the better one is in the second PR
    assert out["best-speedup"] == f"{max(speedups):.4g}"
    summary = w.summary.read_text()
    assert all(f"Pull request [#{p.number}]({u})" in summary for p, u in zip(ordered, urls, strict=True))
    for number, url in zip(json.loads(out["pr-numbers"]), json.loads(out["pr-urls"]), strict=True):
        assert f"pull request #{number}: {url}" in res.output

def test_workflow_dispatch_follows_the_repository_config(world: ActionWorld):
    w = world
    config = "pr_grouping: single\nbudget: {rounds: 2, wall_seconds: 60}\nignore: ['models/mlp.py']\n"
    w.shas["main"] = w.repo.commit({".github/fusebot.yml": config}, "configure fusebot")
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("workflow_dispatch", dispatch_payload()))
    assert res.exit_code == 0, res.output
    [job] = w.jobs
    assert [t.name for t in job.targets] == ["models.attn.Attention"]
    assert (job.trigger, job.budget.rounds, job.budget.wall_seconds) == ("dispatch", 2, 60.0)
    [pull] = bot_prs(w)
    assert pull.head_ref == "fusebot/main/kernels"


def test_the_token_is_never_logged_written_or_inherited(world: ActionWorld, caplog: pytest.LogCaptureFixture):
    caplog.set_level(logging.DEBUG)
    w = world
    w.checkout(w.shas["feature"])
    res = run_action(w, w.event("pull_request", w.labeled()), FUSEBOT_LOG_LEVEL="DEBUG")
    assert res.exit_code == 0 and len(bot_prs(w)) == 1, res.output
    assert any("api" in r.name or "github" in r.name or "urllib3" in r.name for r in caplog.records)
    assert TOKEN not in caplog.text and TOKEN not in res.output
    assert TOKEN not in w.summary.read_text() and TOKEN not in w.output.read_text()
    assert TOKEN not in w.environ_seen.values()  # the search, and every process it starts, never has it


def test_a_config_error_is_annotated_at_its_line_and_fails_the_step(world: ActionWorld):
    w = world
    w.shas["main"] = w.repo.commit({".github/fusebot.yml": "version: 1\npr_grouping: sometimes\n"}, "bad config")
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("schedule", schedule_payload()))
    assert res.exit_code == ExitStatus.USAGE
    assert "::error file=.github/fusebot.yml,line=2::pr_grouping" in res.output
    assert w.jobs == [] and "configuration error" in w.summary.read_text()
    printed = res.output.split("fusebot: configuration error. `.github/fusebot.yml` is invalid:\n", 1)[1]
    assert printed.startswith("  - line 2: pr_grouping: Input should be 'per-target' or 'single'")  # not only ":"


def test_a_config_target_naming_a_missing_class_is_a_configuration_error_at_its_line(world: ActionWorld):
    w = world
    config = "targets:\n  - file: models/attn.py\n    class: Atention\n"
    w.shas["main"] = w.repo.commit({".github/fusebot.yml": config}, "configure fusebot")
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("schedule", schedule_payload()))
    assert res.exit_code == ExitStatus.USAGE and w.jobs == []
    assert "::error file=.github/fusebot.yml,line=3::targets.0.class: models/attn.py defines no class Atention" \
        in res.output


def test_a_marked_file_with_a_syntax_error_is_annotated_at_its_line_not_nothing_to_do(world: ActionWorld):
    w = world
    w.checkout(w.shas["main"])
    text = (w.workspace / "models" / "attn.py").read_text()
    broken = text.replace("def get_inputs():", "def get_inputs(:")
    w.shas["main"] = w.repo.commit({"models/attn.py": broken, "models/mlp.py": broken.replace("Attention", "MLP")},
                                   "typo")
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("schedule", schedule_payload()))
    line = broken.splitlines().index("def get_inputs(:") + 1
    assert res.exit_code == ExitStatus.USAGE and w.jobs == []
    assert f"::error file=models/attn.py,line={line}::syntax error" in res.output
    summary = w.summary.read_text()
    assert "marked files need fixing" in summary and "No marked targets" not in summary
    assert str(w.workspace) not in summary


def test_missing_settings_refuse_to_start_naming_the_variable(world: ActionWorld):
    w = world
    env = w.event("schedule", schedule_payload())
    del env["GITHUB_SHA"]
    res = CliRunner().invoke(cli.app, ["action"], env={**env, "FUSEBOT_GITHUB_TOKEN": ""})
    assert res.exit_code == ExitStatus.USAGE
    assert "GITHUB_SHA" in res.output and "token is empty" in res.output
    assert w.jobs == [] and w.fake.calls == []
    res = CliRunner().invoke(cli.app, ["action"], env={**w.event("schedule", schedule_payload()), "FUSEBOT_GPUS": "0;1"})
    assert res.exit_code == ExitStatus.USAGE and "gpus takes device indices like 0,1" in res.output and w.jobs == []


def test_a_failed_search_fails_the_check_run_and_the_step(world: ActionWorld, monkeypatch: pytest.MonkeyPatch):
    w = world

    def broken(job: Job, source_dir: Path, progress) -> JobResult:
        raise RuntimeError(f"CUDA error: no device (token {TOKEN})")

    monkeypatch.setattr(bot.action.entry, "search", broken)
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("workflow_dispatch", dispatch_payload()))
    assert res.exit_code == ExitStatus.MACHINE
    [run] = w.fake.check_run_list()
    assert run["conclusion"] == "failure" and "CUDA error: no device" in run["output"]["summary"]
    assert TOKEN not in run["output"]["summary"] and TOKEN not in w.summary.read_text()
    assert bot_prs(w) == []



def test_github_unreachable_is_a_broken_machine_exit_3(world: ActionWorld, monkeypatch: pytest.MonkeyPatch):
    w = world

    def unreachable(settings, run_job=None, platform_factory=None):
        raise PlatformError(f"could not reach api.github.com (token {TOKEN})")

    monkeypatch.setattr(bot.action.entry, "run", unreachable)
    res = run_action(w, w.event("workflow_dispatch", dispatch_payload()))
    assert res.exit_code == ExitStatus.MACHINE
    assert "::error title=fusebot::could not reach api.github.com" in res.output and TOKEN not in res.output

def test_a_fork_on_plain_pull_request_gets_results_and_patch_in_the_summary(world: ActionWorld):
    """On `pull_request` GitHub gives a fork's run a read-only token: writes answer 403. The step still succeeds,
    with the fork's results and patch in the job summary, and nothing is written to the repository."""
    w = world
    w.checkout(w.shas["feature"])
    refs_before = w.fake.refs(REPO)
    w.fake.fail_next.update({"POST /repos/{owner}/{repo}/check-runs": 403,
                             "POST /repos/{owner}/{repo}/issues/{issue_number}/comments": 403})
    res = run_action(w, w.event("pull_request", w.labeled(fork=True)))
    assert res.exit_code == 0, res.output
    assert len(w.jobs) == 1 and w.fake.fail_next == {}  # both writes were tried, and refused
    assert w.fake.refs(REPO) == refs_before and bot_prs(w) == [] and w.fake.comments == {}
    summary = w.summary.read_text()
    assert "read-only token" in summary and "pull_request_target" in summary
    assert "git apply fusebot.patch" in summary and "new file mode 100644" in summary
    kernel = next(p for p in w.results[0].targets[0].files if p.endswith(".cu") or p.endswith(".cpp"))
    assert f"+++ b/fusebot_kernels/{kernel}" in summary


def test_the_action_module_never_imports_torch_or_the_search():
    loaded = modules_after_import("bot.action.entry", "bot.action.settings", "bot.action.report", "bot.repo.config_docs")
    assert "bot.action.entry" in loaded
    assert not any(m == "torch" or m.startswith("torch.") for m in loaded)
    assert {m for m in loaded if m.startswith("runner.")} <= {"runner.contract"}


def test_models_without_an_endpoint_stop_before_anything_starts(world: ActionWorld):
    w = world
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("workflow_dispatch", dispatch_payload()), FUSEBOT_MODELS="gpt-x",
                     FUSEBOT_LLM_BASE_URL="", FUSEBOT_LLM_API_KEY="")
    assert res.exit_code == ExitStatus.USAGE, res.output
    assert "::error title=fusebot LLM settings::FUSEBOT_LLM_BASE_URL" in res.output
    assert w.jobs == [] and w.fake.calls == []  # no check run, no search
    assert "LLM settings are invalid" in w.summary.read_text()


def test_the_search_gets_llm_proposers_and_its_processes_never_the_llm_key(world: ActionWorld,
                                                                          monkeypatch: pytest.MonkeyPatch):
    import runner.pipeline

    w = world
    seen: dict = {}

    def fake_run_job(job: Job, source_dir: Path, progress, *, proposer_pools=None) -> JobResult:
        seen.update(environ=dict(os.environ), pools=proposer_pools)
        w.jobs.append(job)
        return fake_result(job, improved_result(), slow_result())

    monkeypatch.setattr(bot.action.entry, "search", REAL_SEARCH)
    monkeypatch.setattr(runner.pipeline, "run_job", fake_run_job)
    w.checkout(w.shas["main"])
    res = run_action(w, w.event("workflow_dispatch", dispatch_payload()), FUSEBOT_MODELS="model-a,model-b",
                     FUSEBOT_LLM_BASE_URL="http://127.0.0.1:9/v1", FUSEBOT_LLM_API_KEY=LLM_KEY)
    assert res.exit_code == 0, res.output
    # one pool per search run at once (on this CPU host: one), made before the LLM key left the environment
    assert [[p.name for p, _ in pool] for pool in seen["pools"]] == [["catalog", "rewrite", "model-a", "model-b"]]
    assert LLM_KEY not in seen["environ"].values() and TOKEN not in seen["environ"].values()
    assert len(bot_prs(w)) == 1
