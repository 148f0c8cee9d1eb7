"""Edge-value trials (runner.harness.problem.with_edge_values, runner.harness.plan): a kernel right on the factory's
inputs and wrong on large magnitudes or NaN is rejected; non-finite values must be where the reference's are, or
the float64 oracle's."""

import pytest
import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness import verify
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.harness.plan import Seeds, trial_plan
from runner.harness.problem import edge_values, with_edge_values

from ..adversarial import CLAMPED_GELU, HONEST_FAST, HONEST_GELU, NAN_TO_ZERO_GELU
from ..conftest import FAST_TIMER, PROBLEMS


def gelu_spec(**kw) -> ProblemSpec:
    return ProblemSpec(name="gelu", path=str(PROBLEMS / "gelu.py"), **kw)


def cand(cid: str, sources: dict[str, str]) -> Candidate:
    return Candidate(id=cid, format="fast", backend="cpu", sources=sources)


@pytest.fixture(scope="module")
def gelu_evaluator(harness_cache):
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(gelu_spec(), backend="cpu", config=cfg) as ev:
        yield ev


def test_edge_values_cover_every_class_and_keep_the_rest():
    x = torch.randn(64, 256)
    x0 = x.clone()
    y = with_edge_values(x, torch.Generator().manual_seed(3), nonfinite=True)
    assert torch.equal(x, x0) and y.shape == x.shape  # a copy: the factory's tensor is untouched
    changed = (y != x) & ~(torch.isnan(y) & torch.isnan(x))
    assert 0 < int(changed.sum()) <= x.numel() // 8
    v = y.reshape(-1)
    assert bool(torch.isnan(v).any()) and bool((v == float("inf")).any()) and bool((v == float("-inf")).any())
    assert bool((v.abs() == 1e4).any()) and bool((v.abs() == 30.0).any())
    tiny = (v != 0) & (v.abs() < torch.finfo(torch.float32).smallest_normal)
    assert bool(tiny.any())  # subnormals
    assert bool(((v == 0) & torch.signbit(v)).any())  # -0.0
    finite = with_edge_values(x, torch.Generator().manual_seed(3), nonfinite=False)
    assert bool(torch.isfinite(finite).all())
    assert max(edge_values(torch.float16, True)[:-3], key=abs) <= 1e2  # squares stay finite in half precision


def test_the_plan_adds_two_edge_trials_on_the_first_shape():
    plan = trial_plan(Seeds(), "c", trials=5, shape_sets=2, large=False, randn_trials=True)
    assert [(p["shape_set"], p.get("edge")) for p in plan] == [(0, None)] * 5 + [(0, "finite"), (0, "nonfinite")] + [
        (1, None)] * 2
    off = trial_plan(Seeds(), "c", trials=5, shape_sets=1, large=False, randn_trials=True, edge_trials=False)
    assert not any(p.get("edge") for p in off)


def test_non_finite_values_match_the_reference_or_the_oracle():
    """Eager's float32 GELU of +inf is NaN, the exact value +inf: a kernel giving either passes; a finite value
    where both are non-finite, or NaN where the reference is finite, does not."""
    ref = torch.tensor([float("nan"), float("nan"), 1.0, float("inf")])
    oracle = torch.tensor([float("nan"), float("inf"), 1.0, float("inf")], dtype=torch.float64)
    ok = torch.tensor([float("nan"), float("inf"), 1.0, float("inf")])
    assert verify.compare_to_oracle(ref, oracle, ok, 1e-4, 1e-4, 0).passed
    assert verify.compare_to_oracle(ref, oracle, ref.clone(), 1e-4, 1e-4, 0).passed
    zero_for_nan = torch.tensor([0.0, float("inf"), 1.0, float("inf")])
    assert verify.compare_to_oracle(ref, oracle, zero_for_nan, 1e-4, 1e-4, 0).reasons[0].startswith("nan-mismatch")
    finite_for_inf = torch.tensor([float("nan"), float("inf"), 1.0, 3e38])
    assert verify.compare_to_oracle(ref, oracle, finite_for_inf, 1e-4, 1e-4, 0).reasons[0].startswith("inf-mismatch")


def test_an_honest_gelu_is_accepted_on_edge_values(gelu_evaluator):
    v = gelu_evaluator.evaluate(cand("honest-gelu", HONEST_GELU))
    assert v.accepted, v.reasons
    assert [t.distribution for t in v.trials if "edge" in t.distribution] == ["factory+edge:finite",
                                                                             "factory+edge:nonfinite"]


@pytest.mark.parametrize("name, sources, reason", [("clamped", CLAMPED_GELU, "mismatch"),
                                                   ("nan_to_zero", NAN_TO_ZERO_GELU, "nan-mismatch")])
def test_a_gelu_wrong_only_on_edge_values_is_rejected(gelu_evaluator, name, sources, reason):
    """Clamped to [-24, 24] (and NaN to -0 by fmaxf), or NaN to 0: right on every input the factory draws, so every
    trial but the edge-value ones passes."""
    v = gelu_evaluator.evaluate(cand(name, sources))
    assert not v.accepted
    assert v.reasons[0].startswith(reason) and "on edge values" in v.reasons[0], v.reasons
    failed = [t for t in v.trials if not t.passed]
    assert len(failed) == 1 and "edge" in failed[0].distribution
    assert all(t.passed for t in v.trials if "edge" not in t.distribution)


def test_without_edge_trials_the_clamped_gelu_passes(harness_cache):
    """What the edge-value trials add: with them off (a problem whose reference is not defined there), the same
    kernel is accepted."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(gelu_spec(edge_trials=False), backend="cpu", config=cfg) as ev:
        v = ev.evaluate(cand("clamped", CLAMPED_GELU))
    assert v.accepted, v.reasons
    assert not any("edge" in t.distribution for t in v.trials)


def test_a_reference_that_raises_on_edge_values_skips_that_trial(harness_cache):
    """A reference not defined on non-finite inputs: its edge trial with them is skipped, and the verdict says so."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    spec = ProblemSpec(name="finite_only", path=str(PROBLEMS / "finite_only.py"))
    with Evaluator(spec, backend="cpu", config=cfg) as ev:
        v = ev.evaluate(cand("honest", HONEST_FAST))
    assert v.accepted, v.reasons
    assert [t.distribution for t in v.trials if "edge" in t.distribution] == ["factory+edge:finite"]
    assert any("no edge-value trial" in w for w in v.warnings), v.warnings
