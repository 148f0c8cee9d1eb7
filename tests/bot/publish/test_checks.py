"""The check run's texts from real Verdicts (the CPU harness run once per session): queued, in progress, success
with the tables and the PR's link, neutral with why when nothing is faster, failure with the job's error."""

from __future__ import annotations

from bot.publish.checks import check_completed, check_in_progress, check_queued
from runner.contract import Progress
from tests.bot.results import improved_result, plan_of, row_numbers, slow_result
from tests.verdicts import real_verdicts


def test_nothing_faster_is_a_neutral_check_with_the_reason_and_no_pr_title():
    plan = plan_of(slow_result())
    assert plan.improved == []
    out = check_completed(plan)
    assert out.conclusion == "neutral" and out.status == "completed"
    assert "nothing beat eager" in out.summary and "No pull request is opened" in out.summary
    assert row_numbers(real_verdicts()["slow"].timing) in out.text

def test_check_run_stages():
    q = check_queued(["ScaledBiasReLU", "ScaledSoftmax"])
    assert q.status == "queued" and "`ScaledSoftmax`" in q.summary
    p = check_in_progress(Progress(round=2, built=5, verified=3, rejected=2, best_speedup=1.375), rounds=3)
    assert p.status == "in_progress" and "round 2/3" in p.summary and "3 verified" in p.summary
    assert "1.38x" in p.title and "as the search timed it" in p.summary
    done = check_completed(plan_of(improved_result()), pr_url="https://example.test/pr/9")
    assert done.conclusion == "success" and "https://example.test/pr/9" in done.summary
    assert row_numbers(real_verdicts()["fused"].timing) in done.summary
    failed = check_completed(plan_of(improved_result()), error="runner lost")
    assert failed.conclusion == "failure" and "runner lost" in failed.summary
