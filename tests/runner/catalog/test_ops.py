"""The scalar op registry (runner.catalog.ops): every op's C expression, compiled with the CPU templates' prelude, gives
torch's value on ordinary numbers, signed zeros, NaN and both infinities (NaN where torch's is NaN: a kernel must not
swallow one); every constant fold gives the C expression's value; the tables built from it (the ATen op set, the
lowering's plain ops) name only ops it has."""

from __future__ import annotations

import ctypes
import math
import subprocess
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from runner.catalog import ops, opset
from runner.catalog.codegen import cpu
from runner.catalog.codegen.common import float_literal
from runner.catalog.codegen.head import MATH
from runner.harness.build import CPU_FLAGS

CSRC = Path(__file__).resolve().parents[3] / "runner/csrc"
VALUES = [0.0, -0.0, 0.3, -0.7, 1.0, -1.0, 2.5, -3.5, 6.0, -6.0, 25.0, -25.0, 1e-3, math.nan, math.inf, -math.inf]

# op -> (attributes, torch on float64 arguments)
TORCH = {
    "add": ((), torch.add), "sub": ((), torch.sub), "mul": ((), torch.mul), "div": ((), torch.div),
    "maximum": ((), torch.maximum), "minimum": ((), torch.minimum), "pow": ((), torch.pow),
    "powc": ((2.5,), lambda x: torch.pow(x, 2.5)), "neg": ((), torch.neg), "recip": ((), torch.reciprocal),
    "square": ((), torch.square), "cube": ((), lambda x: x * x * x), "abs": ((), torch.abs),
    "sign": ((), torch.sign), "trunc": ((), torch.trunc), "exp": ((), torch.exp), "expm1": ((), torch.expm1),
    "log": ((), torch.log), "log1p": ((), torch.log1p), "sqrt": ((), torch.sqrt), "rsqrt": ((), torch.rsqrt),
    "erf": ((), torch.erf), "tanh": ((), torch.tanh), "sigmoid": ((), torch.sigmoid), "cos": ((), torch.cos),
    "sin": ((), torch.sin), "relu": ((), torch.relu), "silu": ((), F.silu), "gelu": ((), F.gelu),
    "gelu_tanh": ((), lambda x: F.gelu(x, approximate="tanh")), "mish": ((), F.mish), "softsign": ((), F.softsign),
    "selu": ((), F.selu), "hardsigmoid": ((), F.hardsigmoid), "hardswish": ((), F.hardswish),
    "leaky_relu": ((0.1,), lambda x: F.leaky_relu(x, 0.1)), "elu": ((1.5,), lambda x: F.elu(x, 1.5)),
    "softplus": ((2.0, 20.0), lambda x: F.softplus(x, 2.0, 20.0)),
    "clamp_min": ((0.5,), lambda x: torch.clamp_min(x, 0.5)), "clamp_max": ((0.5,), lambda x: torch.clamp_max(x, 0.5)),
    "eq": ((), torch.eq), "ne": ((), torch.ne), "lt": ((), torch.lt), "le": ((), torch.le), "gt": ((), torch.gt),
    "ge": ((), torch.ge), "not": ((), torch.logical_not), "isnan": ((), torch.isnan), "isinf": ((), torch.isinf),
    "where": ((), lambda c, x, y: torch.where(c != 0, x, y)),
    "where_lt": ((), lambda a, b, x, y: torch.where(a < b, x, y)),
    "round_bf16": ((), lambda x: x.float().bfloat16().double()), "round_fp16": ((), lambda x: x.float().half().double()),
    "xlogy_minus": ((), lambda t, y: torch.xlogy(t, t) - t * y),
    "idivmod": ((3.0, 4.0), lambda x: torch.remainder(torch.div(x, 3, rounding_mode="floor"), 4)),
}


def _arguments(arity: int, integer: bool) -> list[torch.Tensor]:
    """Every combination of VALUES over the op's arguments (a sample of them past two), as float32 columns."""
    if integer:
        return [torch.arange(0, 50, dtype=torch.float32)]
    grid = torch.cartesian_prod(*[torch.tensor(VALUES)] * min(arity, 2)).reshape(-1, min(arity, 2))
    cols = [grid[:, k].float().contiguous() for k in range(grid.shape[1])]
    gen = torch.Generator().manual_seed(0)
    for _ in range(arity - len(cols)):
        cols.append(torch.tensor(VALUES)[torch.randint(len(VALUES), (grid.shape[0],), generator=gen)].float())
    return cols


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    """One C++ library: op_<name>(a0, a1, a2, a3, out, n) per op, its C expression over a0[i]..a3[i]."""
    src = [cpu.PRELUDE, MATH]
    for name, o in ops.OPS.items():
        attrs, _ = TORCH[name]
        expr = ops.render(name, [f"a{k}[i]" for k in range(o.arity)], attrs, float_literal)
        src.append(f'extern "C" void op_{name}(const float* a0, const float* a1, const float* a2, const float* a3, '
                   f"float* out, int n) {{ for (int i = 0; i < n; ++i) out[i] = {expr}; }}")
    d = tmp_path_factory.mktemp("ops")
    (d / "ops.cpp").write_text("\n".join(src))
    flags = [f for f in CPU_FLAGS if f != "-fopenmp"]
    done = subprocess.run(["g++", *flags, "-I", str(CSRC), "ops.cpp", "-o", "ops.so"], cwd=d, capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    return ctypes.CDLL(str(d / "ops.so"))


def _run(lib, name: str, args: list[torch.Tensor]) -> torch.Tensor:
    out = torch.empty_like(args[0])
    ptrs = [ctypes.c_void_p(a.data_ptr()) for a in args] + [ctypes.c_void_p(0)] * (4 - len(args))
    getattr(lib, f"op_{name}")(*ptrs, ctypes.c_void_p(out.data_ptr()), ctypes.c_int(out.numel()))
    return out


def test_every_op_has_a_torch_reference_here():
    assert sorted(TORCH) == sorted(ops.OPS)
    assert all(len(TORCH[n][0]) == o.attrs for n, o in ops.OPS.items())


@pytest.mark.parametrize("name", sorted(ops.OPS))
def test_the_c_expression_is_torchs_value_nan_and_infinities_included(library, name):
    o = ops.OPS[name]
    attrs, fn = TORCH[name]
    args = _arguments(o.arity, integer=name == "idivmod")
    got = _run(library, name, args).double()
    with torch.no_grad():
        want = fn(*[a.double() for a in args]).float().double()  # (an fp32 result: 1e-3 ** -25 is inf)
    assert torch.equal(got.isnan(), want.isnan()), (name, [a[got.isnan() != want.isnan()][:4] for a in args])
    tol = 2e-2 if name in ("round_bf16",) else 1e-5
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True, msg=lambda m: f"{name}: {m}")


@pytest.mark.parametrize("name", sorted(n for n, o in ops.OPS.items() if o.fold is not None))
def test_a_fold_is_the_c_expressions_value(library, name):
    o = ops.OPS[name]
    attrs, _ = TORCH[name]
    args = _arguments(o.arity, integer=name == "idivmod")
    got = _run(library, name, args)
    for i in range(0, got.numel(), max(1, got.numel() // 64)):
        values = [float(a[i]) for a in args]
        folded = ops.fold(name, values, attrs)
        if folded is not None and math.isfinite(folded):
            assert math.isclose(folded, float(got[i]), rel_tol=1e-5, abs_tol=1e-6), (name, values, folded, got[i])


def test_the_tables_built_from_the_registry_name_its_ops():
    assert {opset.SAME_ARGS[a] for o in ops.OPS.values() for a in o.aten} <= set(ops.OPS)
    assert opset.SAME_ARGS["reciprocal"] == "recip" and "relu" in ops.PLAIN and "gelu" not in ops.PLAIN
    assert not set(opset.STRUCTURAL) & set(ops.ATEN)  # one row for each ATen op
    assert set(ops.OPS) >= ops.COSTLY and "exp" in ops.COSTLY and "add" not in ops.COSTLY
