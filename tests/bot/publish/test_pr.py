"""PR bodies, check-run texts and comments from real Verdicts (the CPU harness run once per session): numbers
present as the harness measured them, markers present, GitHub's size limit kept with a huge trace; and nothing
published holds a credential or a path outside the repository."""

from __future__ import annotations

import re

import pytest

from bot.github.platform import find_marker
from bot.publish import pr
from bot.publish.benchmark import benchmark_check, benchmark_comment
from runner.contract import Baselines, Job, JobResult, Progress, TargetResult, Verdict
from tests.bot.results import improved_result, plan_of, slow_result
from tests.fakes.evaluators import timing
from tests.verdicts import real_verdicts


def row_numbers(t) -> str:
    return f"| {t.median_ms:.4g} | {t.iqr_ms:.3g} | {t.n} |"


def test_the_body_carries_the_verdicts_numbers_markers_and_adoption():
    r = improved_result()
    v = r.verdict
    body = pr.pr_body(plan_of(r, slow_result()))
    assert body.startswith("<!-- fusebot:pr key=main/examples -->")
    assert find_marker(body, "pr") == "main/examples"
    for t in (v.baselines.eager, v.baselines.compile, v.timing):
        assert row_numbers(t) in body
    base = min(v.baselines.eager.median_ms, v.baselines.compile.median_ms)
    assert f"**{base / v.timing.median_ms:.2f}x** faster" in body  # the verdict line
    assert f"{v.speedup_vs_eager:.2f}x" in body and f"{v.speedup_vs_compile:.2f}x" in body
    assert f"{100 * v.roofline.floor_ms / v.timing.median_ms:.2f}%" in body
    passed = sum(t.passed for t in v.trials)
    assert f"{passed}/{len(v.trials)} trials passed" in body
    assert f"{max(t.max_abs_err for t in v.trials):.3g}" in body
    e = v.environment
    assert f"torch {e.torch}" in body and (e.cpu or e.gpu) in body and f"Python {e.python}" in body
    assert "from fusebot_kernels.scaledbiasrelu.dropin import ScaledBiasReLU" in body
    assert "<details><summary>Search trace: ScaledBiasReLU</summary>" in body
    assert "\n- `Slow`: nothing beat eager" in body  # the slow target: one line with why, not proposed
    assert "/fusebot benchmark" in body and "#7" in body


def test_a_huge_trace_is_truncated_never_the_tables():
    huge = "\n".join(f"| r{i} | idea {i} | rejected at verify | mismatch {'x' * 80} |" for i in range(20_000))
    r = improved_result(trace=huge)
    body = pr.pr_body(plan_of(r, slow_result()))
    assert len(body) <= pr.BODY_LIMIT < len(huge)
    assert pr.target_table(r) in body and pr.target_table(slow_result().model_copy(update={"message": ""})) in body
    assert "| r24 | idea 24 |" in body and "| r25 |" not in body  # clipped to its first rows, saying so
    assert "…19975 more candidate(s) left out; `/fusebot explain` posts the whole trace." in body
    long_rows = "\n".join(f"| r{i} | {'y' * 4000} |" for i in range(20))  # few rows, each enormous
    body = pr.pr_body(plan_of(improved_result(trace=long_rows), slow_result()), limit=30_000)
    cut = re.search(r"trace truncated \((\d+) characters left out\)", body)
    assert len(body) <= 30_000 and cut and int(cut.group(1)) > 0
    assert pr.marker("pr", "main/examples") in body


def test_nothing_faster_is_a_neutral_check_with_the_reason_and_no_pr_title():
    plan = plan_of(slow_result())
    assert plan.improved == []
    out = pr.check_completed(plan)
    assert out.conclusion == "neutral" and out.status == "completed"
    assert "nothing beat eager" in out.summary and "No pull request is opened" in out.summary
    assert row_numbers(real_verdicts()["slow"].timing) in out.text


def test_check_run_stages():
    q = pr.check_queued(["ScaledBiasReLU", "ScaledSoftmax"])
    assert q.status == "queued" and "`ScaledSoftmax`" in q.summary
    p = pr.check_in_progress(Progress(round=2, built=5, verified=3, rejected=2, best_speedup=1.375), rounds=3)
    assert p.status == "in_progress" and "round 2/3" in p.summary and "3 verified" in p.summary
    assert "1.38x" in p.title
    done = pr.check_completed(plan_of(improved_result()), pr_url="https://example.test/pr/9")
    assert done.conclusion == "success" and "https://example.test/pr/9" in done.summary
    assert row_numbers(real_verdicts()["fused"].timing) in done.summary
    failed = pr.check_completed(plan_of(improved_result()), error="runner lost")
    assert failed.conclusion == "failure" and "runner lost" in failed.summary


def test_status_comment_and_fork_comment():
    plan = plan_of(improved_result(), slow_result())
    c = pr.status_comment(7, "done", plan, pr_url="https://example.test/pr/9")
    assert find_marker(c, "status") == "pr-7" and "https://example.test/pr/9" in c
    s = pr.speedup(real_verdicts()["fused"])
    assert f"{s:.2f}x faster" in c
    small = "diff --git a/k.cpp b/k.cpp\n" + "+// line\n" * 100
    [f] = pr.fork_comments(plan, small)
    assert len(f) <= pr.BODY_LIMIT and find_marker(f, "fork") == "pr-7"
    assert "git apply fusebot.patch" in f and small in f and pr.target_table(plan.results[0]) in f


def test_a_fork_patch_larger_than_a_comment_comes_in_parts_of_whole_files():
    plan = plan_of(improved_result())
    files = [f"diff --git a/{n} b/{n}\n" + f"+// {n}\n" * 4_000 for n in ("a.py", "b.py", "c.py")]  # ~40 KB each
    huge = "diff --git a/h.bin b/h.bin\n" + "+x\n" * 40_000  # one file over a comment
    comments = pr.fork_comments(plan, "".join(files) + huge)
    assert len(comments) == 3 and all(len(c) <= pr.BODY_LIMIT for c in comments)
    assert [find_marker(c, "fork") for c in comments] == ["pr-7", "pr-7-part-2", "pr-7-part-3"]
    assert "The patch comes in 3 parts, in this comment and the next 2" in comments[0]
    for k, (c, f) in enumerate(zip(comments, files, strict=True), 1):
        assert f"part {k} of 3" in c and f in c and pr.CUT_NOTE not in c
    assert "`h.bin` (" in comments[0] and "is not in the patch" in comments[0] and "+x\n" not in "".join(comments)
    assert pr.target_table(plan.results[0]) in comments[0]


@pytest.mark.parametrize(("base", "group", "branch"), [("main", "examples", "fusebot/main/examples"),
                                                        ("feature/x", "My Group!", "fusebot/feature/x/my-group")])
def test_branch_names(base, group, branch):
    assert pr.branch_name(base, group) == branch
    with pytest.raises(ValueError):
        pr.marker("pr", "a b")


def test_the_confirmation_rounds_are_shown_per_round():
    from runner.contract import Confirmation

    r = improved_result()
    v = r.verdict
    e, c, k = v.baselines.eager.median_ms, v.baselines.compile.median_ms, v.timing.median_ms
    conf = Confirmation(rounds=2, candidate_ms=[k, k * 1.1], eager_ms=[e, e], compile_ms=[c, c],
                        speedup_vs_eager=[e / k, e / (k * 1.1)], speedup_vs_compile=[c / k, c / (k * 1.1)])
    r = r.model_copy(update={"verdict": v.model_copy(update={"confirmation": conf})})
    body = pr.pr_body(plan_of(r))
    per_round = ", ".join(f"{x:.2f}x" for x in conf.speedup_vs_faster())
    assert "Timed in 2 alternating rounds (fusebot, eager, torch.compile, ...), one process:" in body
    assert per_round in body
    pooled = r.model_copy(update={"verdict": v.model_copy(update={"confirmation": conf.model_copy(
        update={"processes": 2})})})  # a bench script's two runs, as a PR on CUDA states them
    assert "Timed in 2 alternating rounds (fusebot, eager, torch.compile, ...), 2 processes one after the other:" in \
        pr.pr_body(plan_of(pooled))


TOKEN = "ghp_" + "A1b2C3d4" * 5  # a fake token of GitHub's shape
SECRETS = [TOKEN, "github_pat_" + "x9" * 20, "sk-proj-" + "k" * 32, "Bearer abc.def.ghi",
           "MIIEvQIBADANBgkqhkiG9w0BAQEFAASC", "/tmp/fusebot-job-1234/src", "/proc/1/environ"]
LEAKY = (f"runtime: read /proc/1/environ: GITHUB_TOKEN={TOKEN} key=github_pat_{'x9' * 20}; "
         f"OPENAI_API_KEY=sk-proj-{'k' * 32}; headers Authorization: Bearer abc.def.ghi\n"
         "-----BEGIN PRIVATE KEY-----\nMIIEvQIBADANBgkqhkiG9w0BAQEFAASC\n-----END PRIVATE KEY-----\n"
         "build: /tmp/fusebot-job-1234/src/models/mlp.py:3: error")


def leaky_result(improved: bool) -> TargetResult:
    v = Verdict(candidate_id="c1", problem="p", accepted=improved, reasons=[LEAKY], warnings=[LEAKY],
                baselines=Baselines(eager=timing(2.0), compile=timing(1.0), compile_error=None),
                timing=timing(0.5) if improved else None)
    return TargetResult(target="models.mlp.MLP", improved=improved, verdict=v, message=LEAKY, class_name="MLP",
                        file="models/mlp.py", trace_markdown=f"| c1 | rejected | {LEAKY} |",
                        files={"mlp/kernel.cpp": "//"} if improved else {})


def test_what_is_published_holds_no_credential_and_no_path_outside_the_repository():
    texts = [pr.pr_body(plan_of(leaky_result(True), leaky_result(False)))]
    for plan in (plan_of(leaky_result(True)), plan_of(leaky_result(False))):
        out = pr.check_completed(plan, pr_url="https://github.com/acme/models/pull/3")
        patch = f"diff --git a/k.cpp b/k.cpp\n--- /dev/null\n+++ b/k.cpp\n+// {TOKEN}\n"
        [fork] = pr.fork_comments(plan, patch)
        assert "--- /dev/null" in fork  # a patch keeps its paths, so that it still applies
        texts += [out.summary, out.text, pr.status_comment(7, "done", plan), fork]
    texts += [pr.check_completed(plan_of(), error=LEAKY).summary, *pr.explain_comments("job1", [leaky_result(False)])]
    job = Job(id="b1", repo="acme/models", sha="c0ffee" * 6 + "abcd", targets=[], kind="benchmark", pr_number=3)
    result = JobResult(job_id="b1", ok=True, targets=[leaky_result(False)])
    texts += [benchmark_comment(job, result), benchmark_check(job, result).summary]
    for text in texts:
        assert LEAKY not in text and not [s for s in SECRETS if s in text], text
    body = texts[0]
    assert "…/mlp.py:3: error" in body  # the path's last part stays: enough to find the line in the repository
    assert "https://github.com/acme/models/pull/3" in texts[1]  # URLs are not paths


def test_clip_cuts_to_the_limit_and_says_so():
    assert pr.clip("x" * 10, limit=100) == "x" * 10
    cut = pr.clip("y" * 500, limit=100)
    assert len(cut) == 100 and cut.endswith("*…cut to fit GitHub's limit.*")
    assert pr.clip("see /dev/null and fusebot_kernels/a/b.cu and 1/2 and `/fusebot run`") == \
        "see /dev/null and fusebot_kernels/a/b.cu and 1/2 and `/fusebot run`"
