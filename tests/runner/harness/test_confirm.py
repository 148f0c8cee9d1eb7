"""Numbers that hold: CPU timing is pinned (the judge and every candidate's process on the same cores, one torch
thread per core), a confirmation states its spread, and rounds that disagree by more than the threshold are an
unstable measurement (no claim)."""

import pytest

from runner.contract import Candidate, Confirmation
from runner.harness import clocked, confirm
from runner.harness.config import HarnessConfig, timing_cores
from runner.harness.evaluator import Evaluator

from ..adversarial import HONEST_FAST, kb
from ..conftest import FAST_TIMER, scale_relu_spec

PINNED = kb('''        import os
        if os.sched_getaffinity(0) != {0} or torch.get_num_threads() != 1:
            raise RuntimeError(f"not pinned: cores {os.sched_getaffinity(0)}, {torch.get_num_threads()} threads")
        return scale_relu(x, self.bias)
''')


def _conf(candidate_ms, eager_ms):
    return Confirmation(rounds=len(candidate_ms), candidate_ms=candidate_ms, eager_ms=eager_ms,
                        speedup_vs_eager=[e / c for e, c in zip(eager_ms, candidate_ms, strict=True)])


def test_rounds_that_disagree_are_an_unstable_measurement():
    steady = _conf([1.0, 1.02, 0.99, 1.01, 1.0], [2.0, 2.05, 1.98, 2.0, 2.01])
    assert confirm.unstable(steady, 0.25) is None
    assert "1.02" in confirm.spread_text(steady)
    noisy_kernel = _conf([1.0, 1.5, 0.99, 1.01, 1.0], [2.0, 2.05, 1.98, 2.0, 2.01])
    assert "51%" in confirm.unstable(noisy_kernel, 0.25)
    noisy_baseline = _conf([1.0, 1.02, 0.99, 1.01, 1.0], [2.0, 4.0, 1.98, 2.0, 2.01])
    assert confirm.unstable(noisy_baseline, 0.25) is not None
    # a rewrite's confirmation names the rewrite, never "the kernel"
    said = confirm.unstable(noisy_kernel, 0.25, "the PyTorch rewrite")
    assert "the PyTorch rewrite 0.99-1.5 ms (51%)" in said and "kernel" not in said


def test_cpu_timing_is_pinned_to_the_configured_cores(harness_cache):
    assert timing_cores(HarnessConfig(cpu_cores=[3, 1])) == [1, 3]
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache, cpu_cores=[0])
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        v = ev.evaluate(Candidate(id="pinned", format="kernelbench", backend="cpu", sources=PINNED))
    assert v.accepted, v.reasons


@pytest.mark.timing  # real rounds on the CPU: a loaded host's cross-check can end the confirmation before its spread
def test_a_confirmation_states_its_spread_and_an_unstable_one_claims_nothing(harness_cache, monkeypatch):
    # the rounds as the timer measured them: raised to one common bound (a loaded host's), two could be equal
    monkeypatch.setattr(clocked, "common", lambda rounds: rounds)
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache, unstable_spread=0.0)
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        v = ev.confirm(Candidate(id="c", format="fast", backend="cpu", sources=HONEST_FAST), rounds=2)
    assert any(w.startswith("spread: over 2 rounds: the kernel") for w in v.warnings), v.warnings
    assert not v.accepted and v.reasons[0].startswith("unstable-measurement"), v.reasons


def test_the_minimum_effect_leaves_out_the_extreme_rounds_of_five():
    # speedups 2.0, 2.05, 2.1, 2.0 and one preempted round at 40x: the margin follows the four that agree
    one_outlier = _conf([1.0, 1.0, 1.0, 1.0, 0.05], [2.0, 2.05, 2.1, 2.0, 2.0])
    assert confirm.margin(one_outlier) == pytest.approx(0.1 / 2.05)  # 2.0-2.1 over the middle three
    three = _conf([1.0, 1.0, 0.05], [2.0, 2.05, 2.0])  # too few rounds to leave any out
    assert confirm.margin(three) > 10
    assert confirm.margin(_conf([1.0] * 5, [2.0] * 5)) == confirm.MIN_EFFECT
