"""Every dtype judged fairly: a candidate is compared with the float64 oracle, allowed the reference's own error
(runner.harness.oracle, runner.harness.verify.compare_to_oracle). Honest bf16 and fp16 kernels that round once are
accepted, kernels that lose precision are rejected, and where float64 is impossible the verdict says so."""

import math
import re

import pytest
import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness import verify
from runner.harness.evaluator import Evaluator, HarnessConfig

from ..adversarial import (
    DOWNGRADED_BF16,
    DOWNGRADED_FP16,
    FAST_HACKS,
    HONEST_BF16,
    HONEST_FAST,
    HONEST_FP16,
    SCALED_OUTPUTS,
)
from ..conftest import FAST_TIMER, PROBLEMS

SWIGLU = PROBLEMS / "swiglu_bf16.py"


def fast(cid: str, sources: dict[str, str]) -> Candidate:
    return Candidate(id=cid, format="fast", backend="cpu", sources=sources)


def _swiglu(dtype: torch.dtype):
    torch.manual_seed(0)
    a, b = torch.randn(4096).to(dtype), torch.randn(4096).to(dtype)
    eager = torch.nn.functional.silu(a) * b  # rounds twice
    exact = torch.nn.functional.silu(a.double()) * b.double()
    once = (torch.nn.functional.silu(a.float()) * b.float()).to(dtype)  # rounds once
    return eager, exact, once


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_rounding_once_passes_the_oracle_where_the_fp32_tolerance_rejected_it(dtype):
    eager, exact, once = _swiglu(dtype)
    assert not torch.equal(eager, once)  # the fused kernel's result differs from eager's in some ulps
    assert not verify.compare_values(eager, once, 1e-4, 1e-4, 0).passed  # fp32's tolerance: rejected
    atol, rtol = verify.tolerance_for(dtype, None, None)
    assert verify.compare_to_oracle(eager, exact, once, atol, rtol, 0).passed
    coarse = (once.float() * 1.03).to(dtype)  # 3% off: beyond eager's error plus the margin
    cmp = verify.compare_to_oracle(eager, exact, coarse, atol, rtol, 0)
    assert not cmp.passed and cmp.reasons[0].startswith("mismatch: output 0"), cmp.reasons


def test_where_eager_is_non_finite_and_the_oracle_is_not_a_candidate_of_the_oracles_kind_passes():
    """Eager's own kernel can be wrong at a non-finite input (torch 2.13's CPU float32 GELU is NaN at +inf, float64's
    +inf): a candidate that is what the oracle is passes there; one that is something else again does not."""
    inf, nan = math.inf, math.nan
    eager = torch.tensor([nan, nan, 1.0, nan, -inf])
    exact = torch.tensor([inf, 2.0, 1.0, nan, -inf], dtype=torch.float64)
    assert verify.compare_to_oracle(eager, exact, torch.tensor([inf, 2.0, 1.0, nan, -inf]), 1e-4, 1e-4, 0).passed
    assert verify.compare_to_oracle(eager, exact, torch.tensor([nan, nan, 1.0, nan, -inf]), 1e-4, 1e-4, 0).passed
    for wrong in ([-inf, 2.0, 1.0, nan, -inf], [inf, 2.5, 1.0, nan, -inf], [inf, 2.0, 1.0, 0.0, -inf],
                  [inf, 2.0, 1.0, nan, inf]):
        cmp = verify.compare_to_oracle(eager, exact, torch.tensor(wrong), 1e-4, 1e-4, 0)
        assert not cmp.passed, wrong


def test_integer_outputs_are_exact_and_the_dtype_picks_the_tolerance():
    assert verify.tolerance_for(torch.bfloat16, None, None) == (1e-2, 1e-2)
    assert verify.tolerance_for(torch.float32, None, None) == (1e-4, 1e-4)
    assert verify.tolerance_for(torch.float16, 3e-3, None) == (3e-3, 1e-2)  # the problem's own atol wins
    ref = torch.tensor([1, 2, 3])
    assert not verify.compare_values(ref, torch.tensor([1, 2, 4]), 1.0, 1.0, 0).passed


@pytest.fixture(scope="module")
def swiglu_cpu(harness_cache):
    # the problem declares no dtype: its bf16 comes from its outputs
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(ProblemSpec(name="swiglu", path=str(SWIGLU)), backend="cpu", config=cfg) as ev:
        yield ev


def test_an_honest_bf16_fused_kernel_is_accepted(swiglu_cpu):
    v = swiglu_cpu.evaluate(fast("bf16", HONEST_BF16))
    assert v.accepted, v.reasons
    assert not any("no float64 oracle" in w for w in v.warnings), v.warnings
    assert any(t.max_abs_err > 0 for t in v.trials)  # it is not eager's result: it is a more accurate one


def test_a_bf16_kernel_at_8_bit_precision_is_rejected(swiglu_cpu):
    v = swiglu_cpu.evaluate(fast("bf16-coarse", DOWNGRADED_BF16))
    assert not v.accepted and v.reasons[0].startswith("mismatch: output 0"), v.reasons
    assert "float64 oracle" in v.reasons[0]


def test_fp16_honest_accepted_and_downgraded_rejected(harness_cache):
    spec = ProblemSpec(name="swiglu16", path=str(SWIGLU), dtype="float16")
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=cfg) as ev:
        good, bad = ev.evaluate_many([fast("fp16", HONEST_FP16), fast("fp16-coarse", DOWNGRADED_FP16)])
    assert good.accepted, good.reasons
    assert not bad.accepted and bad.reasons[0].startswith("mismatch"), bad.reasons


def test_bf16_arithmetic_inside_an_fp32_problem_is_a_precision_downgrade(cpu_evaluator):
    v = cpu_evaluator.evaluate(fast("bf16-inside", FAST_HACKS["bf16_inside_fp32"][0]))
    assert not v.accepted
    assert any(r.startswith("mismatch") and "precision downgrade" in r for r in v.reasons), v.reasons


def test_outputs_scaled_by_1_01_are_a_mismatch_at_the_worst_element_not_a_precision_downgrade(cpu_evaluator):
    v = cpu_evaluator.evaluate(fast("scaled", SCALED_OUTPUTS))
    assert not v.accepted
    [reason] = [r for r in v.reasons if r.startswith("mismatch")]
    assert "precision" not in reason, reason
    found = re.search(r"worst at flat index \d+, by \S+: got (\S+), expected (\S+) \(the oracle\)", reason)
    assert found, reason
    got, expected = float(found[1]), float(found[2])
    assert got == pytest.approx(expected * 1.01, rel=1e-5), reason


REFUSES_DOUBLE = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
    def forward(self, x):
        if x.dtype != torch.float32:
            raise TypeError("float32 only")
        return torch.relu(x * 2.0 + self.bias)
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return [256]
'''

TRANSPOSED = '''
import torch, torch.nn as nn
class Model(nn.Module):
    def forward(self, x):
        return (x * 2.0).t()  # a view: strides (1, 256)
def get_inputs():
    return [torch.randn(64, 256)]
def get_init_inputs():
    return []
'''

TRANSPOSE_KERNEL = r'''
#include "fusebot.h"
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream; (void)n_in; (void)n_out;
  const float* x = (const float*)in[0].data; float* y = (float*)out[0].data;
  int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  for (int64_t c = 0; c < cols; ++c)
    for (int64_t r = 0; r < rows; ++r) y[c * rows + r] = 2.0f * x[r * cols + c];
  return 0;
}
'''


def test_a_module_that_refuses_float64_falls_back_to_the_tolerance_and_says_so(tmp_path, harness_cache):
    (tmp_path / "p.py").write_text(REFUSES_DOUBLE)
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(ProblemSpec(name="p", path=str(tmp_path / "p.py")), backend="cpu", config=cfg) as ev:
        v = ev.evaluate(fast("honest", HONEST_FAST))
    assert v.accepted, v.reasons
    assert any(w.startswith("tolerance: output 0: no float64 oracle (the reference refused float64 (TypeError")
               for w in v.warnings), v.warnings


def test_a_non_contiguous_reference_output_is_compared_by_value(tmp_path, harness_cache):
    (tmp_path / "p.py").write_text(TRANSPOSED)
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(ProblemSpec(name="p", path=str(tmp_path / "p.py")), backend="cpu", config=cfg) as ev:
        good = ev.evaluate(fast("transpose", {"kernel.cpp": TRANSPOSE_KERNEL}))
        wrong = ev.evaluate(fast("no-transpose", {"kernel.cpp": TRANSPOSE_KERNEL.replace(
            "y[c * rows + r]", "y[r * cols + c]").replace("x[r * cols + c]", "x[r * cols + c] + 0.0f")}))
    assert good.accepted, good.reasons
    assert not wrong.accepted and wrong.reasons[0].startswith("mismatch"), wrong.reasons
