"""The judge's rule for a non-finite trial, in process: a kernel's outputs on inputs holding NaN and both infinities
(runner.harness.problem.nonfinite_values) against the module's, as runner.harness.procs.judge compares them (the
float64 oracle, outputs the module spreads NaN through, values its own mask discards)."""

from __future__ import annotations

import torch

from runner.harness import verify
from runner.harness.oracle import oracle_model, oracle_outputs
from runner.harness.problem import nonfinite_values
from runner.harness.procs import judge


def nonfinite_inputs(xs: list, seed: int) -> list:
    """The trial's inputs: NaN, +inf and -inf at three positions of every floating input."""
    return [nonfinite_values(x.contiguous(), seed * 7 + i) if isinstance(x, torch.Tensor) and x.is_floating_point()
            else x for i, x in enumerate(xs)]


def judged(model: torch.nn.Module, xs: list, outs: list[torch.Tensor]) -> list[str]:
    """The reasons the judge would refuse `outs` as the module's outputs on `xs` (empty: accepted)."""
    st = judge.State()
    st.model, st.device = model, "cpu"
    st.oracle, _ = oracle_model(model)
    flat = judge._run_reference(st, xs)[0]
    oracles, _ = oracle_outputs(st.oracle, xs, flat)
    st.tols = {0: [verify.tolerance_for(t.dtype, None, None) for t in flat]}
    twin = judge.masked_twin(st, xs, flat)
    st.twins = {0: twin} if twin is not None else {}
    reasons: list[str] = []
    for i, (r, o) in enumerate(zip(flat, outs, strict=True)):
        o = o.view(r.shape)
        atol, rtol = st.tols[0][i]
        cmp = (verify.compare_to_oracle(r, oracles[i], o, atol, rtol, i) if oracles[i] is not None
               else verify.compare_values(r, o, atol, rtol, i))
        reasons += judge.nonfinite_reasons(st, 0, i, r, o, cmp.reasons)[0] if cmp.reasons else []
    return reasons
