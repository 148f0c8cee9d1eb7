"""Edge-value trials (runner.harness.plan, runner.harness.problem.edge_values): the last trial on the problem's first
shape puts signed zeros, denormals, the boundaries of piecewise functions and magnitudes past the usual
approximations' tails into every floating input, where the problem takes any values and its reference is defined
there; the candidate is then judged against the float64 oracle like any trial."""

import math

import pytest
import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.harness.plan import Seeds, trial_plan
from runner.harness.problem import EDGE_EVERY, EDGE_VALUES, edge_values
from runner.harness.procs import judge

from ..adversarial import CLAMPED_GELU, HONEST_GELU
from ..conftest import FAST_TIMER, PROBLEMS


def test_the_last_trial_on_the_first_shape_draws_edge_values_where_the_problem_takes_any_values():
    for large, first in ((False, 5), (True, 3)):
        plan = trial_plan(Seeds(), "t", trials=5, shape_sets=2, large=large, randn_trials=True)
        assert len(plan) == first + 2  # no trial more than before: the last of the first shape's is the edge one
        assert [bool(p.get("edge")) for p in plan] == [False] * (first - 1) + [True, False, False]
        assert plan[first - 1]["randn"] is None and plan[first - 1]["shape_set"] == 0
    plan = trial_plan(Seeds(), "t", trials=5, shape_sets=1, large=False, randn_trials=False)
    assert not any(p.get("edge") for p in plan)  # inputs that must keep their own distribution keep it


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_edge_values_are_every_kind_at_secret_positions(dtype):
    x = torch.full((64, 512), 0.5, dtype=dtype)
    e = edge_values(x, seed=11)
    changed = e != x
    assert 0.5 / EDGE_EVERY < float(changed.float().mean()) < 1.5 / EDGE_EVERY
    assert torch.equal(e, edge_values(x, seed=11)) and not torch.equal(e, edge_values(x, seed=12))
    seen = e[changed].float()
    tiny = torch.finfo(dtype).tiny
    assert bool(((seen != 0) & (seen.abs() < tiny)).any()), "no denormal"
    assert bool(((seen == 0) & torch.signbit(seen)).any()) and bool(((seen == 0) & ~torch.signbit(seen)).any())
    for v in (1.0, -3.0, 6.0, 30.0, -60.0):
        assert bool((seen == v).any()), v
    assert bool(torch.isfinite(e).all())  # no inf or NaN is drawn (docs/harness.md, "Not covered")
    assert len(EDGE_VALUES) == 16


def test_a_reference_not_finite_on_edge_values_is_not_defined_there():
    ok = [torch.ones(3)]
    assert judge._undefined(ok, [torch.ones(3, dtype=torch.float64)]) is None
    assert "reference" in judge._undefined([torch.tensor([1.0, math.inf])], [None])
    assert "oracle" in judge._undefined(ok, [torch.tensor([1.0, math.nan, 2.0], dtype=torch.float64)])


def test_a_gelu_wrong_past_its_tails_is_rejected_and_an_honest_one_accepted(harness_cache):
    """A GELU whose argument is clamped to [-24, 24] is right wherever its own inputs and randn draws go; the edge
    trial's 30 and 60 show it. The honest erf GELU passes every trial, the edge one included."""
    spec = ProblemSpec(name="gelu", path=str(PROBLEMS / "gelu.py"))
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=cfg) as ev:
        honest, clamped = ev.evaluate_many([Candidate(id="gelu", format="fast", backend="cpu", sources=HONEST_GELU),
                                            Candidate(id="gelu-24", format="fast", backend="cpu",
                                                      sources=CLAMPED_GELU)])
    assert honest.accepted, honest.reasons
    assert honest.trials[4].distribution == "factory with edge values" and honest.trials[4].passed, honest.trials
    assert not clamped.accepted and clamped.reasons[0].startswith("mismatch"), clamped.reasons
    assert [t.passed for t in clamped.trials] == [True] * 4 + [False], clamped.trials
