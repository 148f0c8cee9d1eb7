"""The PTX reader of ptx.py on hand-written PTX (it finds a 64-bit division inside a loop, and only there), and what
the fast-math variants compile to."""

from __future__ import annotations

import shutil

import pytest

from runner.catalog.codegen import cuda
from runner.catalog.ir import Input, Load, Op, Program
from tests.runner.catalog.codegen.ptx import compile_ptx, loop_divisions, unit_of

PTX = """
.visible .entry _ZN5cand010fb_rows_v1ENS_6FbArgsE(
{
\tdiv.s64 \t%rd1, %rd2, %rd3;
$L__BB0_1:
\tmul.hi.u64 \t%rd4, %rd1, %rd5;
\trem.u64 \t%rd6, %rd4, %rd7;
\tsetp.lt.s64 \t%p1, %rd6, %rd8;
\t@%p1 bra \t$L__BB0_1;
\tdiv.u64 \t%rd9, %rd6, %rd7;
\tbra.uni \t$L__BB0_3;
$L__BB0_3:
\tret;
}
.visible .entry _ZN5cand110fb_flat_v4ENS_6FbArgsE(
{
$L__BB1_1:
\tdiv.u32 \t%r1, %r2, %r3;
\tmul.hi.s64 \t%rd1, %rd2, 7;
\t@%p1 bra \t$L__BB1_1;
\tdiv.s64 \t%rd3, %rd4, %rd5;
}
"""


def test_a_64_bit_division_counts_inside_a_loop_only():
    found = loop_divisions(PTX)
    assert found == {"_ZN5cand010fb_rows_v1ENS_6FbArgsE": ["rem.u64 \t%rd6, %rd4, %rd7;"],
                     "_ZN5cand110fb_flat_v4ENS_6FbArgsE": []}
    assert [unit_of(e) for e in found] == [0, 1]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_fast_math_takes_the_hardware_tanh_and_the_accurate_variant_does_not(tmp_path):
    """A tanh-GELU's fast-math candidate computes tanh in one tanh.approx.f32; the accurate one, compiled after it in
    the same unit, keeps the accurate formula (the fast defines do not leak into the next source)."""
    prog = Program(inputs=[Input(0, (64, 256), "float32")], out=Op("gelu_tanh", (Load(0),)), shape=(64, 256), axes=(),
                   out_dtype="float32", out_shape=(64, 256))
    fast, exact = (cuda.render(prog, cuda.CudaParams("flat", vec=4, threads=256, fast_math=f)) for f in (True, False))
    ptx = compile_ptx([fast, exact], tmp_path)
    tanh = {unit_of(b.split("(")[0]): b.count("tanh.approx.f32") for b in ptx.split(".entry ")[1:]}
    assert tanh[0] > 0 and tanh[1] == 0, tanh
