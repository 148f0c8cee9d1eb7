"""Real verdicts for tests of what users see: the harness itself (CPU backend) run once per test session on an
example module, with the seed proposer's fused kernel and a deliberately slow variant of it."""

from __future__ import annotations

import functools
from pathlib import Path

from runner.contract import Candidate, ProblemSpec, Verdict
from runner.proposers.seed import SeedProposer
from runner.search.types import History, Idea, ProblemContext

ROOT = Path(__file__).resolve().parents[1]
EXAMPLE = ROOT / "examples" / "mlp_epilogue.py"
SPEC = ProblemSpec(name="ScaledBiasReLU", root=str(ROOT), module="examples.mlp_epilogue", class_name="ScaledBiasReLU",
                   second_inputs="get_second_inputs")
SLOW_REPEATS = 200  # the slow variant recomputes its output this many times


def seed_candidate(backend: str = "cpu") -> Candidate:
    ctx = ProblemContext(name=SPEC.name, reference_source=EXAMPLE.read_text(), backend=backend)
    return SeedProposer().implement(ctx, Idea(text="fuse"), History(), 1)[0].model_copy(update={"id": "fused"})


def slow_candidate() -> Candidate:
    fast = seed_candidate()
    src = fast.sources["kernel.cpp"].replace("  for (int64_t r = 0; r < rows; ++r) {",
                                             f"  for (int rep = 0; rep < {SLOW_REPEATS}; ++rep)\n"
                                             "  for (int64_t r = 0; r < rows; ++r) {", 1)
    assert src != fast.sources["kernel.cpp"]
    return fast.model_copy(update={"id": "slow", "sources": {"kernel.cpp": src}})


@functools.cache
def real_verdicts() -> dict[str, Verdict]:
    """{"fused": an accepted verdict that beats eager, "slow": an accepted verdict slower than eager}."""
    from runner.harness.evaluator import Evaluator

    with Evaluator(SPEC, backend="cpu", compile_baseline=True) as ev:
        ev.baselines()
        ev.roofline()
        fused, slow = ev.evaluate_many([seed_candidate(), slow_candidate()])
    assert fused.accepted and slow.accepted, (fused.reasons, slow.reasons)
    return {"fused": fused, "slow": slow}
