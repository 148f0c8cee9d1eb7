"""The CUDA `regs` layout (runner/catalog/codegen/cuda/regs.py): short rows held in registers, several rows a block.

On the CPU its kernels run through tests/runner/cuda_emulation.py in threaded mode (a block's threads at once, warp
shuffles and block barriers real): values against torch for LayerNorm, RMSNorm, softmax, a row sum and an argmax, in
fp32 and bf16, groups of 4-32 lanes and a whole block per row, row counts that leave a block's last groups idle, a
misaligned input (the scalar kernel) and another row count than the captured one (rows come from the call); a call
with another row length is refused. Every rendered source compiles with nvcc (sm_90)."""

from __future__ import annotations

import shutil
import subprocess

import pytest
import torch

from runner.catalog.codegen import cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.codegen.cuda.regs import MAX_HELD_BYTES, held_bytes, loads_ahead, regs_refusal, short_row_params
from runner.catalog.ir import Const, Input, Load, Op, Program, Red
from runner.harness.procs.abi import AbiError, KernelLibrary
from tests.runner import cuda_emulation
from tests.runner.catalog.codegen import programs
from tests.runner.catalog.codegen.nvcc import compile_together

DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def reference(name: str, xs: list[torch.Tensor]) -> torch.Tensor:
    """The program's value in fp32 from the inputs as stored, rounded to the first input's dtype."""
    x = xs[0].float()
    if name == "layernorm":
        y = torch.nn.functional.layer_norm(x, x.shape[-1:], xs[1].float(), xs[2].float(), 1e-5)
    elif name == "rmsnorm":
        y = x * torch.rsqrt(x.square().mean(-1, keepdim=True) + 1e-6) * xs[1].float()
    elif name == "softmax":
        y = torch.softmax(x, -1)
    elif name == "row_sum":
        y = x.sum(-1)
    else:
        return x.argmax(-1)
    return y.to(xs[0].dtype)


def inputs(name: str, rows: int, n: int, dtype: str, offset: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(rows * 7 + n)
    x = torch.randn(rows * n + offset, generator=gen).to(DT[dtype])[offset:].view(rows, n)
    extra = {"layernorm": 2, "rmsnorm": 1}.get(name, 0)
    return [x] + [torch.randn(n, generator=gen).to(DT[dtype]) for _ in range(extra)]


# (program, row length, dtype, params): warp groups, sub-warp groups, a block per row, both modes
CASES = [
    ("layernorm", 256, "float32", cuda.CudaParams("regs", vec=4, threads=128, group=32, mode="twopass")),
    ("layernorm", 256, "float32", cuda.CudaParams("regs", vec=4, threads=64, group=8, mode="online")),
    ("layernorm", 512, "bfloat16", cuda.CudaParams("regs", vec=8, threads=64, group=16, mode="twopass")),
    ("rmsnorm", 384, "float32", cuda.CudaParams("regs", vec=4, threads=128, group=0, mode="twopass")),
    ("rmsnorm", 256, "bfloat16", cuda.CudaParams("regs", vec=8, threads=64, group=4, mode="twopass")),
    ("softmax", 96, "float32", cuda.CudaParams("regs", vec=4, threads=64, group=16, mode="online")),
    ("softmax", 160, "bfloat16", cuda.CudaParams("regs", vec=2, threads=64, group=32, mode="twopass")),
    ("softmax", 1024, "float32", cuda.CudaParams("regs", vec=4, threads=128, group=0, mode="twopass")),
    ("row_sum", 200, "float32", cuda.CudaParams("regs", vec=4, threads=64, group=32)),
    ("row_argmax", 120, "float32", cuda.CudaParams("regs", vec=4, threads=64, group=8)),
]
TOL = {"float32": dict(rtol=1e-5, atol=1e-5), "bfloat16": dict(rtol=1.6e-2, atol=1e-2)}


def _program(name: str, rows: int, n: int, dtype: str):
    return getattr(programs, name)(rows, n, dtype)


def _sources() -> dict[str, str]:
    return {f"case{k}": cuda.render(_program(name, 6, n, dt), params) for k, (name, n, dt, params) in enumerate(CASES)}


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_regs_kernels_match_torch_on_an_emulated_gpu(tmp_path):
    srcs = _sources()
    libs = cuda_emulation.build(srcs, tmp_path, threaded=tuple(srcs))
    for k, (name, n, dt, params) in enumerate(CASES):
        lib = KernelLibrary(libs[f"case{k}"])
        gpb = params.threads // (params.group or params.threads)
        # captured; other rows, a block's groups idle; misaligned; more rows than a wave of blocks holds (each block
        # walks several, loading the next ahead where it does)
        wave = cuda_emulation.SMS * cuda_emulation.BLOCKS_PER_SM
        for rows, offset in ((6, 0), (2 * gpb + 1, 0), (3, 1), (2 * wave * gpb + 1, 0)):
            xs = inputs(name, rows, n, dt, offset)
            ref = reference(name, xs)
            out = torch.empty_like(ref)
            lib(xs, [out], None)
            want = "fb_regs_v1" if offset or params.vec == 1 else f"fb_regs_v{params.vec}"
            assert cuda_emulation.last_kernel(lib) == want, (k, rows, offset)
            if ref.dtype == torch.int64:
                assert torch.equal(out, ref), (k, rows)
            else:
                torch.testing.assert_close(out.float(), ref.float(), **TOL[dt], msg=f"case {k}, {rows} rows")
        with pytest.raises(AbiError, match=f"dim 1 differs from the captured size {n}"):  # (the set-up's check)
            xs = inputs(name, 4, n + params.vec, dt)
            lib(xs, [torch.empty_like(reference(name, xs))], None)


def test_the_source_names_its_fixed_sizes():
    """`regs` fixes the row length (its registers are sized for it); the rows layout takes all sizes from the call,
    and says so (runner/catalog/sizes.py)."""
    ln = programs.layernorm(64, 1024)
    src = cuda.render(ln, cuda.CudaParams("regs", vec=4, threads=256, group=32, mode="twopass"))
    assert src.splitlines()[2] == "// fusebot-sizes: in0=d0,1024 in1=1024 in2=1024"
    rows = cuda.render(ln, cuda.CudaParams("rows", vec=4, threads=256, group=32))
    assert rows.splitlines()[2] == "// fusebot-sizes: in0=d0,d1 in1=d1 in2=d1"


def test_short_row_params_fit_the_row():
    """16-byte vectors, at most 8 a thread, a warp per row first where 8 vectors a lane cover the row, else a block
    whose threads come from the row (every thread a vector or more); none past 16K elements or for a middle dim;
    every set renders."""
    assert [p.label() for p in short_row_params(programs.layernorm(4096, 1024))][:1] == ["cuda-regs-v4-t256-g32-twopass"]
    assert {p.vec for p in short_row_params(programs.rmsnorm(4096, 1024, "bfloat16"))} == {8}
    assert all(p.group in (0, *range(2, 33)) for p in short_row_params(programs.softmax(64, 2048)))
    assert short_row_params(programs.layernorm(16, 1 << 15)) == []
    for prog, vec in ((programs.rmsnorm(64, 4096, "bfloat16"), 8), (programs.softmax(64, 16384), 4)):
        sets = short_row_params(prog)
        n = prog.shape[-1]
        assert sets and all(p.group == 0 and p.vec == vec and p.threads * vec <= n <= 8 * p.threads * vec for p in sets)
    assert [p.threads for p in short_row_params(programs.rmsnorm(64, 4096, "bfloat16"))][:1] == [256]  # 2 vectors each
    assert {p.vec for p in short_row_params(programs.row_argmax(64, 1024, "bfloat16"))} == {8}  # (an int64 per row)
    # a warp per bf16 softmax row of 2048 holds 8 vectors and their fp32 scores a lane (over MAX_HELD_BYTES): the
    # heaviest block that fits comes first, 4 vectors a thread, then 2, then 1; the warp last
    heavy = programs.softmax(64, 2048, "bfloat16")
    sets = short_row_params(heavy)
    assert [(p.group, p.threads) for p in sets if p.mode == "twopass"] == [(0, 64), (0, 128), (0, 256), (32, 256)]
    assert [held_bytes(heavy, p)[1] for p in sets[:3]] == sorted((held_bytes(heavy, p)[1] for p in sets[:3]),
                                                                 reverse=True)
    assert all(held_bytes(heavy, p)[1] <= MAX_HELD_BYTES for p in sets[:3])
    for prog in (programs.layernorm(512, 96), programs.softmax(64, 2048, "bfloat16"), programs.row_sum(8, 40)):
        sets = short_row_params(prog)
        assert sets
        for p in sets:
            assert regs_refusal(prog, p) is None
            cuda.render(prog, p)


def test_regs_refuses_what_it_cannot_hold():
    with pytest.raises(NotExpressible, match="whole vectors"):
        cuda.render(programs.layernorm(8, 1022), cuda.CudaParams("regs", vec=4, threads=128, group=32))
    with pytest.raises(NotExpressible, match="bytes of registers"):
        cuda.render(programs.layernorm(8, 1 << 14), cuda.CudaParams("regs", vec=4, threads=128, group=32))
    with pytest.raises(NotExpressible, match="power of two"):
        cuda.render(programs.layernorm(8, 1024), cuda.CudaParams("regs", vec=4, threads=128, group=64))


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_every_short_row_set_compiles(tmp_path):
    sources = [src for src in _sources().values()]
    for make in (programs.layernorm, programs.rmsnorm, programs.softmax, programs.row_argmax):
        for n, dt in ((1024, "float32"), (1024, "bfloat16"), (2048, "float16"), (128, "float32")):
            prog = make(64, n, dt)
            sources += [cuda.render(prog, p) for p in short_row_params(prog)]
    rc, log = compile_together(sources, tmp_path)
    assert rc == 0, log[:3000]


def _vector_kernel_ptx(src: str, entry: str, where) -> str:
    (where / "k.cu").write_text(src)
    p = subprocess.run(["nvcc", "-O3", "-std=c++17", "-ptx", "-arch=sm_90", "-I", str(cuda_emulation.CSRC), "k.cu",
                        "-o", "k.ptx"], cwd=where, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return next(b for b in (where / "k.ptx").read_text().split(".entry ")[1:] if b.startswith(f"_Z10{entry}"))


def _loads(ptx: str) -> int:
    return sum("ld.global.nc.v4" in ln for ln in ptx.splitlines())


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_row_is_read_from_memory_once(tmp_path):
    """The held row is loaded before the first pass and never again: one 16-byte load of x per vector position in
    the vector kernel's PTX (LayerNorm over rows of 1024: 8 positions a lane), whatever the number of passes. (fp32
    rows of 1024 a warp hold 256 bytes a thread: no room for the next row's, so none is loaded ahead.)"""
    src = cuda.render(programs.layernorm(64, 1024), cuda.CudaParams("regs", vec=4, threads=256, group=32,
                                                                     mode="twopass"))
    assert not loads_ahead(programs.layernorm(64, 1024), cuda.CudaParams("regs", vec=4, threads=256, group=32))
    body = _vector_kernel_ptx(src, "fb_regs_v4", tmp_path)
    assert _loads(body) == 8 + 2 * 8, _loads(body)  # x's 8 vectors, and the weight's and bias's at each output position


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_next_rows_loads_are_issued_before_this_rows_reductions(tmp_path):
    """bf16 LayerNorm over rows of 1024 a warp (4 vector positions a lane): with two buffers the kernel loads the
    first row before its loop and, in the loop, the next row's 4 vectors before this row's first shuffle, so 8 loads
    of x precede any reduction and each row is still read once (the weight's and bias's 8 come after); with one
    buffer only the row's own 4 precede it. The launch caps the two-buffer kernel's grid to one wave of resident
    blocks (every block has next rows to load)."""
    prog = programs.layernorm(64, 1024, "bfloat16")
    for buffers, before in ((2, 4 + 4), (1, 4)):
        params = cuda.CudaParams("regs", vec=8, threads=256, group=32, mode="twopass", buffers=buffers)
        assert loads_ahead(prog, params) == (buffers == 2)
        src = cuda.render(prog, params)
        body = _vector_kernel_ptx(src, "fb_regs_v8", tmp_path)
        first, _, rest = body.partition("shfl.sync")
        assert (_loads(first), _loads(rest)) == (before, 8), (buffers, _loads(first), _loads(rest))
        assert ("fb_wave(fb_regs_v8, 256)" in src) == (buffers == 2)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_held_rows_exponentials_are_computed_once(tmp_path):
    """Softmax over held rows of 1024 (8 vector positions of 4 a lane): exp(x - max) is computed in the sum's pass
    and kept in registers for the output, one ex2 per element in the vector kernel's PTX (two before: once for the
    sum, once for the output); the scalar kernel, which reads memory in every pass, still computes it twice."""
    src = cuda.render(programs.softmax(64, 1024), cuda.CudaParams("regs", vec=4, threads=128, group=32, mode="twopass"))
    (tmp_path / "k.cu").write_text(src)
    p = subprocess.run(["nvcc", "-O3", "-std=c++17", "-ptx", "-arch=sm_90", "-I", str(cuda_emulation.CSRC), "k.cu",
                        "-o", "k.ptx"], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()
    count = {name: sum("ex2.approx" in ln for ln in b.splitlines())
             for b in ptx.split(".entry ")[1:] for name in ("fb_regs_v4", "fb_regs_v1") if b.startswith(f"_Z10{name}")}
    assert count["fb_regs_v4"] == 8 * 4, count
    assert count["fb_regs_v1"] > 0 and "kp0" not in src.split("fb_regs_v1(")[1].split("fb_regs_v4(")[0], count


def test_a_held_rows_scaled_scores_are_computed_once():
    """Softmax of round_bf16((x + 1) * 0.125) (three ops, no transcendental: a causal softmax's scaled, masked and
    rounded score has the same shape): the first pass computes the score and keeps it in registers, the sum's pass
    reads it there and puts exp(s - max) in its place (the score is not needed again), and the output reads that, so
    each element's score and exp are computed once, in one set of registers."""
    x = Load(0)
    s = Op("round_bf16", (Op("mul", (Op("add", (x, Const(1.0))), Const(0.125))),))
    e = Op("exp", (Op("sub", (s, Red("max", s))),))
    prog = Program(inputs=[Input(0, (64, 1024), "bfloat16")], out=Op("div", (e, Red("sum", e))), shape=(64, 1024),
                   axes=(1,), out_dtype="bfloat16", out_shape=(64, 1024))
    src = cuda.render(prog, cuda.CudaParams("regs", vec=8, threads=128, group=32, mode="twopass"))
    v8 = src.split("fb_regs_v8(FbArgs")[1].split("fusebot_forward")[0]
    assert v8.count("fb_round_bf16(") == 1, v8  # the score, once (the store rounds the output)
    assert v8.count("fb_exp(") == 1 and "kp1" not in v8, v8
    first, _, rest = v8.partition("fb_group_reduce")
    sums, _, out = rest.partition("fb_group_reduce")
    assert "kp0[q][j] = " in first and "fb_exp" not in first, first  # the score, kept
    assert "- rv0)" in sums and sums.count("kp0[q][j] = ") == 1, sums  # read there, its exp stored in its place
    assert "kp0[q][j]" in out and "kp0[q][j] = " not in out and "fb_round_bf16" not in out, out


def test_a_log_sum_exp_softmax_takes_one_exp_per_held_element():
    """torch's softmax as the capture writes it, exp(x - lse(x)): in two passes the output is exp(x - max) times the
    sum's reciprocal, the exponential the sum's pass took and kept, so the vector kernel has one exp (and no log in
    the output); the exponential's registers fit beside the row's."""
    x = Load(0)
    prog = Program(inputs=[Input(0, (64, 2048), "bfloat16")], out=Op("exp", (Op("sub", (x, Red("lse", x))),)),
                   shape=(64, 2048), axes=(1,), out_dtype="bfloat16", out_shape=(64, 2048))
    q = short_row_params(prog)[0]
    # a block of 64 per row, 32 elements a thread: 106 registers (ptxas -v, sm_90), not the warp per row's 157
    assert (q.group, q.threads, q.mode) == (0, 64, "twopass")
    src = cuda.render(prog, q)
    v8 = src.split("fb_regs_v8(FbArgs")[1].split("fusebot_forward")[0]
    assert v8.count("fb_exp(") == 1 and "kp0[q][j] = " in v8, v8
    out = v8.split("fb_block_reduce<AccSum")[1]
    assert "(kp0[q][j] * rv2)" in out and "logf" not in out.split("rv2 = ")[1], out


@pytest.mark.parametrize("out_dtype", ["bfloat16", "float32"])
def test_an_outputs_last_rounding_to_its_dtype_is_the_stores(out_dtype):
    """A softmax whose result the module rounds to bf16 (`.type(torch.bfloat16)`): stored as bf16, the store's own
    conversion is that rounding, so the output pass converts once; stored as fp32, the rounding stays."""
    x = Load(0)
    e = Op("exp", (Op("sub", (x, Red("max", x))),))
    prog = Program(inputs=[Input(0, (64, 1024), "bfloat16")], out=Op("round_bf16", (Op("div", (e, Red("sum", e))),)),
                   shape=(64, 1024), axes=(1,), out_dtype=out_dtype, out_shape=(64, 1024))
    src = cuda.render(prog, cuda.CudaParams("regs", vec=8, threads=128, group=32, mode="twopass"))
    out = src.split("fb_regs_v8(FbArgs")[1].split("fusebot_forward")[0].split("fb_group_reduce")[-1]
    assert ("fb_round_bf16(" in out) == (out_dtype == "float32"), out
