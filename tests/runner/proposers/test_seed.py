"""The seed proposer (the demo's fallback): one fused idea for an elementwise target, none for what it cannot read, and
kernels that the real harness (CPU backend) verifies."""

from __future__ import annotations

from pathlib import Path

from runner.contract import ProblemSpec
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.proposers.seed import IDEA_FUSED, SeedProposer
from runner.search.types import History, ProblemContext
from tests.runner.conftest import FAST_TIMER

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def ctx(example: str) -> ProblemContext:
    return ProblemContext(name=example, reference_source=(EXAMPLES / f"{example}.py").read_text(), backend="cpu")


def test_one_fused_idea_for_an_elementwise_target_tried_once_and_none_for_a_matmul():
    seed = SeedProposer()
    [idea] = seed.ideas(ctx("swish_bias"), History(), 4)
    assert idea.text == IDEA_FUSED
    assert seed.ideas(ctx("swish_bias"), History(ideas=[idea]), 4) == []
    assert seed.ideas(ctx("row_gain"), History(), 4) == []  # diag(gain) @ x: not elementwise as written


def test_both_kernels_for_swish_bias_are_verified_by_the_harness(harness_cache):
    seed = SeedProposer()
    [idea] = seed.ideas(ctx("swish_bias"), History(), 1)
    plain, fast = seed.implement(ctx("swish_bias"), idea, History(), 2)
    assert (plain.extra_cflags, fast.extra_cflags) == ([], ["-ffast-math"])
    spec = ProblemSpec(name="SwishBias", root=str(EXAMPLES.parent), module="examples.swish_bias",
                       class_name="SwishBias", second_inputs="get_second_inputs")
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=cfg) as ev:
        verdicts = ev.evaluate_many([plain.model_copy(update={"id": "plain"}), fast.model_copy(update={"id": "fast"})])
    for v in verdicts:
        assert v.accepted, (v.candidate_id, v.reasons)
        assert {t.shape_set for t in v.trials} == {0, 1} and all(t.passed for t in v.trials)
