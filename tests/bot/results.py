"""TargetResults and PR plans made from real Verdicts (the CPU harness, run once per session)."""

from __future__ import annotations

from bot.publish.plan import PullRequestPlan
from runner.contract import TargetResult
from runner.results.files import Provenance, target_files
from tests.verdicts import SPEC, real_verdicts, seed_candidate


def improved_result(trace: str = "### Round 1\n| candidate | verdict |\n| --- | --- |\n| fused | verified |") -> TargetResult:
    v = real_verdicts()["fused"]
    files = target_files(SPEC, seed_candidate(), v, Provenance.for_verdict(SPEC.name, v, "acme/models", "abc123"))
    return TargetResult(target=SPEC.name, improved=True, verdict=v, message="faster", files=files,
                        trace_markdown=trace, file="examples/mlp_epilogue.py", class_name=SPEC.class_name)


def slow_result() -> TargetResult:
    v = real_verdicts()["slow"]
    return TargetResult(target="Slow", improved=False, verdict=v, class_name="Slow",
                        message=f"nothing beat eager ({v.baselines.eager.median_ms:.4g} ms)", trace_markdown="r1")


def plan_of(*results: TargetResult) -> PullRequestPlan:
    return PullRequestPlan(repo="acme/models", base="main", group="examples", commit="abc123def4567890",
                           results=list(results), environment=real_verdicts()["fused"].environment, source_pr=7)


def row_numbers(t) -> str:
    """A timing's median, IQR and n as a benchmark table's row shows them."""
    return f"| {t.median_ms:.4g} | {t.iqr_ms:.3g} | {t.n} |"
