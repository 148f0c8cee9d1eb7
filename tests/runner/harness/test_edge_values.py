"""Edge-value trials (runner.harness.plan, runner.harness.problem.edge_values): the last trial on the problem's first
shape puts signed zeros, denormals, the boundaries of piecewise functions and magnitudes past the usual
approximations' tails into every floating input, and the one before it NaN, +inf and -inf
(problem.nonfinite_values), where the problem takes any values and its reference is defined there; the candidate is
then judged against the float64 oracle like any trial, its non-finite elements where the reference's are."""

import math

import pytest
import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness import verify
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.harness.plan import Seeds, trial_plan
from runner.harness.problem import EDGE_EVERY, EDGE_VALUES, edge_values, nonfinite_values
from runner.harness.procs import judge

from ..adversarial import CLAMPED_FINITE_GELU, CLAMPED_GELU, HONEST_FAST, HONEST_GELU, NAN_DROPPING
from ..conftest import FAST_TIMER, PROBLEMS, scale_relu_spec


def test_the_last_trial_on_the_first_shape_draws_edge_values_where_the_problem_takes_any_values():
    for large, first in ((False, 5), (True, 3)):
        plan = trial_plan(Seeds(), "t", trials=5, shape_sets=2, large=large, randn_trials=True)
        assert len(plan) == first + 2  # no trial more than before: the last of the first shape's is the edge one
        assert [bool(p.get("edge")) for p in plan] == [False] * (first - 1) + [True, False, False]
        assert plan[first - 1]["randn"] is None and plan[first - 1]["shape_set"] == 0
        # the one before it draws NaN and the infinities, beside its randn draw (not for a large problem)
        assert [bool(p.get("nonfinite")) for p in plan] == [False] * (first - 2) + [not large, False, False, False]
        assert not large and plan[first - 2]["randn"] is not None or large
    plan = trial_plan(Seeds(), "t", trials=5, shape_sets=1, large=False, randn_trials=False)
    assert not any(p.get("edge") or p.get("nonfinite") for p in plan)  # inputs that keep their own distribution


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
    assert bool(torch.isfinite(e).all())  # NaN and the infinities have their own trial
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
        honest, clamped, finite = ev.evaluate_many([
            Candidate(id="gelu", format="fast", backend="cpu", sources=HONEST_GELU),
            Candidate(id="gelu-24", format="fast", backend="cpu", sources=CLAMPED_GELU),
            Candidate(id="gelu-24-finite", format="fast", backend="cpu", sources=CLAMPED_FINITE_GELU)])
    assert honest.accepted, honest.reasons
    assert honest.trials[4].distribution == "factory with edge values" and honest.trials[4].passed, honest.trials
    assert honest.trials[3].distribution.endswith("with NaN and infinities") and honest.trials[3].passed
    # clamped, NaN becomes -0 and +inf 24: the non-finite trial shows it; letting them through, the edge trial does
    assert not clamped.accepted and clamped.reasons[0].startswith("nan-mismatch"), clamped.reasons
    assert [t.passed for t in clamped.trials] == [True] * 3 + [False], clamped.trials
    assert not finite.accepted and finite.reasons[0].startswith("mismatch"), finite.reasons
    assert [t.passed for t in finite.trials] == [True] * 4 + [False], finite.trials


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_nonfinite_values_are_nan_and_both_infinities_at_secret_positions(dtype):
    x = torch.full((64, 512), 0.5, dtype=dtype)
    e = nonfinite_values(x, seed=5)
    assert int(torch.isnan(e).sum()) == 1 and int((e == math.inf).sum()) == 1 and int((e == -math.inf).sum()) == 1
    assert int((e == 0.5).sum()) == x.numel() - 3
    assert torch.equal(e.isnan(), nonfinite_values(x, seed=5).isnan())
    assert not torch.equal(e.isnan(), nonfinite_values(x, seed=6).isnan())
    assert nonfinite_values(torch.ones(2), seed=1).isfinite().sum() == 0  # as many as it has elements
    assert nonfinite_values(torch.ones(0), seed=1).numel() == 0


PEAK_RSS = """
import resource, sys, torch
from runner.harness.problem import nonfinite_values
x = torch.ones(1 << 27, dtype=torch.float16)  # 256 MiB; a permutation of its positions would be 1 GiB of int64
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
e = nonfinite_values(x, seed=7)
grown = (resource.getrusage(resource.RUSAGE_SELF).ru_maxrss - before) >> 10
assert int((e == 1).sum()) == e.numel() - 3
print(grown)
"""


def test_drawing_the_nonfinite_positions_takes_no_host_memory_beyond_the_copy():
    """Every process of a trial draws the positions (the judge and each contestant): on a 2^29-element input a
    permutation of all positions took 4 GiB of host memory in each, and verifying contestants were OOM-killed."""
    import subprocess
    import sys

    grown_mib = int(subprocess.run([sys.executable, "-c", PEAK_RSS], capture_output=True, text=True, check=True,
                                   timeout=120).stdout)
    assert grown_mib < 256 + 128, grown_mib  # the copy (256 MiB) and little else


def test_a_kernel_that_drops_nan_is_rejected_where_torch_keeps_it(harness_cache):
    """relu as `v > 0 ? v : 0` is right on every finite input; the non-finite trial's NaN, which torch.relu keeps, it
    makes 0. The honest kernel (`v < 0 ? 0 : v`) keeps it and is accepted."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        honest, dropping = ev.evaluate_many([Candidate(id="keeps", format="fast", backend="cpu", sources=HONEST_FAST),
                                             Candidate(id="drops", format="fast", backend="cpu",
                                                       sources=NAN_DROPPING)])
    assert honest.trials and all(t.passed for t in honest.trials), honest.trials  # (its timing: the host's load)
    assert not dropping.accepted and dropping.reasons[0].startswith("nan-mismatch"), dropping.reasons
    assert "with NaN and infinities" in dropping.trials[-1].distribution


def test_a_module_that_spreads_nan_allows_a_kernel_that_keeps_it_at_its_element():
    """diag(g) @ x: a NaN in x makes its whole column NaN (0 * NaN), an inf makes the rest of its column NaN; the
    kernel g[:, None] * x keeps each at its element. The NaN and Inf reasons are dropped, with a note; a kernel that
    swallows a kind the module's output holds, or puts one where the module is finite, keeps them."""
    x = torch.randn(4, 5)
    x[1, 2], x[3, 0] = math.nan, math.inf
    g = torch.rand(4) + 0.5
    module, kernel = torch.diag(g) @ x, g[:, None] * x
    cmp = verify.compare_values(module, kernel, 1e-5, 1e-5, 0)
    assert any(r.startswith("nan-mismatch") for r in cmp.reasons)
    kept, note = verify.spread_nonfinite(module, kernel, cmp.reasons, 0)
    assert kept == [] and "module spreads them" in note and "at 2 elements" in note
    swallowed = kernel.nan_to_num(nan=0.0, posinf=math.inf)  # a NaN made 0, the inf kept
    assert verify.spread_nonfinite(module, swallowed, ["nan-mismatch: x"], 0) == (["nan-mismatch: x"], None)
    extra = kernel.clone()
    extra[0, 4] = math.nan  # non-finite where the module is finite
    assert verify.spread_nonfinite(module, extra, ["nan-mismatch: x"], 0) == (["nan-mismatch: x"], None)
    flipped = kernel.clone()
    flipped[3, 0] = -math.inf  # the module's +inf there
    assert verify.spread_nonfinite(module, flipped, ["inf-mismatch: x"], 0) == (["inf-mismatch: x"], None)
    nan_for_inf = kernel.clone()
    nan_for_inf[3, 0] = math.nan  # NaN where the module keeps its +inf
    assert verify.spread_nonfinite(module, nan_for_inf, ["inf-mismatch: x"], 0) == (["inf-mismatch: x"], None)


def test_a_diagonals_inf_that_meets_a_column_the_matmul_made_nan_is_spreading():
    """diag(g) @ x with g and x both holding NaN and infinities (the non-finite trial puts them into every floating
    input): where g's inf row crosses a column that x's NaN or inf turned NaN, the module holds NaN (inf + NaN) and the
    kernel g[:, None] * x its inf. Spreading, as a whole NaN column is."""
    g, x = nonfinite_values(torch.randn(64), 3), nonfinite_values(torch.randn(64, 20), 4)
    module, kernel = torch.diag(g) @ x, g[:, None] * x
    r, o = module.reshape(-1), kernel.reshape(-1)
    assert bool((r.isnan() & o.isinf()).any())  # the crossing is there
    cmp = verify.compare_values(module, kernel, 1e-5, 1e-5, 0)
    kept, note = verify.spread_nonfinite(module, kernel, cmp.reasons, 0)
    assert kept == [] and "module spreads them" in note


class _Pooling(torch.nn.Module):
    def forward(self, x, mask):  # sentence-transformers' masked mean pooling
        m = mask.unsqueeze(-1).expand(x.size()).float()
        return (x * m).sum(1) / m.sum(1).clamp(min=1e-9)


class _Relu(torch.nn.Module):
    def forward(self, x, mask):
        return torch.relu(x * mask.unsqueeze(-1).float())


def _judge_on(model: torch.nn.Module, x: torch.Tensor, mask: torch.Tensor) -> tuple[judge.State, list]:
    """A judge's state after preparing one non-finite trial of `model` on (x, mask)."""
    from runner.harness.oracle import oracle_model

    st = judge.State()
    st.model, st.device = model, "cpu"
    st.oracle, _ = oracle_model(model)
    flat = judge._run_reference(st, [x, mask])[0]
    st.tols = {0: [(1e-5, 1e-5)]}
    twin = judge.masked_twin(st, [x, mask], flat)
    st.twins = {0: twin} if twin is not None else {}
    return st, flat


def test_nan_under_a_padding_mask_may_go_unread_a_nan_the_output_depends_on_may_not():
    """Masked mean pooling spreads an inf or a NaN at a padded token into its row (x * 0 is NaN): a kernel that
    skips padded tokens (runner.catalog.skipping.find_guard) is right on every finite input and matches the module
    with those values finite. A NaN at a kept token stays the module's NaN; under a ReLU (its output depends on the
    value) nothing is discarded, so a kernel that makes it 0 is still refused."""
    gen = torch.Generator().manual_seed(0)
    x, mask = torch.randn(3, 6, 4, generator=gen), torch.tensor([[1, 1, 1, 0, 0, 0]] * 3)
    keep = mask.unsqueeze(-1).float()
    x[0, 4, 1], x[1, 5, 2] = math.inf, math.nan  # two padded tokens
    st, ref = _judge_on(_Pooling(), x, mask)
    assert ref[0].isnan().sum() == 2 and st.twins[0][2] == 2  # rows 0 and 1 poisoned by their padding
    skipping = torch.where(keep > 0, x, 0.0).sum(1) / keep.sum(1)  # padded tokens unread: finite everywhere
    cmp = verify.compare_values(ref[0], skipping, 1e-5, 1e-5, 0)
    assert cmp.reasons and verify.spread_nonfinite(ref[0], skipping, cmp.reasons, 0)[0]  # NaN swallowed, alone
    note = judge.against_twin(st, 0, 0, skipping)
    assert note and "its own mask discards" in note and "2 NaN or infinite" in note

    x[2, 1, 3] = math.nan  # and one at a kept token: row 2's own NaN, which the module keeps and so must a kernel
    st, ref = _judge_on(_Pooling(), x, mask)
    assert ref[0].isnan().sum() == 3 and st.twins[0][2] == 2
    skipping = torch.where(keep > 0, x, 0.0).sum(1) / keep.sum(1)
    assert judge.against_twin(st, 0, 0, skipping) is not None
    assert judge.against_twin(st, 0, 0, skipping.nan_to_num(nan=0.0)) is None  # row 2's NaN made 0

    st, ref = _judge_on(_Relu(), x, torch.ones(3, 6, dtype=torch.long))
    assert st.twins == {}  # relu(x) depends on every x
    shifted = _Relu()
    shifted.forward = lambda x, mask: torch.relu(x * 2.0 - 4.0)  # 0 at 0.75 and at -1.5 alike, not at 1000
    assert _judge_on(shifted, x, mask)[0].twins == {}
    st, ref = _judge_on(_Relu(), x, mask)  # relu(NaN * 0) is NaN in torch; the padded positions are discarded
    assert st.twins[0][2] == 2
    kept = torch.relu(torch.where(keep > 0, x, 0.0))
    assert judge.against_twin(st, 0, 0, kept) is not None
    assert judge.against_twin(st, 0, 0, kept.nan_to_num(0.0)) is None
