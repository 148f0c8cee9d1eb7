"""The CUDA `flat` and `bcast` layouts: which inputs take the broadcast fast path, and the generated kernels checked
against torch on odd shapes, misaligned pointers and run-time shapes that leave the captured broadcast pattern: on
the CPU through tests/runner/cuda_emulation.py (the CUDA source compiled by g++ against stub headers), on a GPU
(pytest -m gpu) through nvcc."""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch

from runner.catalog.codegen import cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.ir import Const, Input, Load, Op, Program
from runner.catalog.space import strategies
from runner.harness.procs.abi import KernelLibrary
from tests.runner import cuda_emulation

CSRC = Path(__file__).resolve().parents[3] / "runner/csrc"


def _prog(shape: tuple[int, ...], ins: list[tuple[int, ...]], out) -> Program:
    return Program(inputs=[Input(k, s, "float32") for k, s in enumerate(ins)], out=out, shape=shape, out_shape=shape)


X, Y, Z, W = Load(0), Load(1), Load(2), Load(3)
DIAG = _prog((64, 96), [(64, 1), (64, 96)], Op("mul", (X, Y)))  # diag(a) @ B as captured: a[:, None] * B
BIAS = _prog((64, 96), [(64, 96), (96,), ()], Op("mul", (Op("relu", (Op("add", (X, Y)),)), Z)))  # relu(x + b) * s
CHANNEL = _prog((4, 8, 6, 10), [(4, 8, 6, 10), (8, 1, 1), (1, 8, 1, 1)], Op("add", (Op("mul", (X, Y)), Z)))
MIXED = _prog((48, 96), [(48, 96), (96,), (48, 1), (96,)],  # sigmoid(x * w + b) - 0.5 * tanh(z)
              Op("sub", (Op("sigmoid", (Op("add", (Op("mul", (X, Y)), Z)),)),
                         Op("mul", (Const(0.5), Op("tanh", (W,)))))))
THREE = _prog((4, 6, 12), [(4, 6, 12), (4, 1, 12), (6, 1)], Op("add", (Op("mul", (X, Y)), Z)))  # y varies along A, C
ANY = _prog((2, 3, 4, 5), [(2, 3, 4, 5), (3, 1, 5)], Op("mul", (X, Y)))  # four runs: the general index path
GELU = _prog((8, 100), [(8, 100)], Op("gelu_tanh", (X,)))


def test_the_broadcast_view_of_rows_columns_and_channels():
    assert cuda.broadcast_view(DIAG).present == ((False, True, False), (False, True, True))
    assert cuda.broadcast_view(DIAG).sizes == (1, 64, 96)
    view = cuda.broadcast_view(BIAS)
    assert view.present == ((False, True, True), (False, False, True), (False, False, False)) and not view.three
    view = cuda.broadcast_view(CHANNEL)
    assert view.three and view.sizes == (4, 8, 60) and view.present[1] == (False, True, False)
    assert cuda.broadcast_view(MIXED) is not None
    assert cuda.broadcast_view(THREE).present == ((True, True, True), (True, False, True), (False, True, False))
    assert cuda.broadcast_view(ANY) is None and cuda.broadcast_view(GELU) is None


def test_the_search_tries_the_broadcast_path_first_where_it_applies():
    for p in (DIAG, BIAS, CHANNEL, THREE, MIXED):
        ss = strategies(p, "cuda")
        assert ss[0].key == "cuda-flat-broadcast" and all(x.layout == "bcast" for x in ss[0].params)
        assert "no division per element" in ss[0].text
        src = cuda.render(p, ss[0].params[0])
        bc = src[src.index("void __launch_bounds__"):src.index("fb_flat_v1(FbArgs a)")]  # the bcast kernels
        assert "fb_bc_v4(FbArgs a, FbBc g)" in bc and "fb_bidx" not in bc
    for p in (ANY, GELU):
        assert all(s.key != "cuda-flat-broadcast" for s in strategies(p, "cuda"))
        with pytest.raises(NotExpressible):
            cuda.render(p, cuda.CudaParams("bcast", vec=4, threads=256))
    # fast math only where it changes the code: a product and a ReLU have no transcendental to make cheaper
    assert [s.key for s in strategies(DIAG, "cuda")] == ["cuda-flat-broadcast", "cuda-flat-vector"]
    assert [s.key for s in strategies(GELU, "cuda")] == ["cuda-flat-vector", "cuda-flat-fast"]
    first = strategies(GELU, "cuda")[0].params[:2]
    assert [p.label() for p in first] == ["cuda-flat-v4-t256-once-u2", "cuda-flat-v4-t256-once-u4"]


# ---- the kernels against torch --------------------------------------------------------------------------------------


@dataclass
class Case:
    shapes: list[tuple[int, ...]]  # run-time input shapes
    kernel: str  # the kernel the host code must pick ("" where any will do)
    offset: tuple[int, ...] = ()  # per input (then the output), elements the data pointer is moved by
    big: bool = False  # on the GPU only (sequential emulation of 16M elements takes too long)


def _reference(p: Program, xs: list[torch.Tensor]) -> torch.Tensor:
    if p is DIAG or p is ANY:
        return xs[0] * xs[1]
    if p is BIAS:
        return torch.relu(xs[0] + xs[1]) * xs[2]
    if p is CHANNEL or p is THREE:
        return xs[0] * xs[1] + xs[2]
    if p is MIXED:
        return torch.sigmoid(xs[0] * xs[1] + xs[2]) - 0.5 * torch.tanh(xs[3])
    return torch.nn.functional.gelu(xs[0], approximate="tanh")


def _tensor(shape: tuple[int, ...], offset: int, device: str, gen: torch.Generator) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    flat = torch.randn(n + offset, generator=gen).to(device)
    return flat[offset:].view(shape)  # contiguous, its data pointer `offset` elements past an aligned one


# (program, params, cases): vector and scalar paths, odd rows, misaligned inputs and outputs, one row, grid-stride
# over several tiles (the emulated GPU holds 6 blocks), and shapes that broadcast otherwise at run time
CASES = [
    (DIAG, cuda.CudaParams("bcast", vec=4, threads=32, grid="stride", unroll=4), [
        Case([(64, 1), (64, 96)], "fb_bc_v4"),
        Case([(37, 1), (37, 45)], "fb_bc_v1"),
        Case([(64, 1), (64, 96)], "fb_bc_v1", (0, 1, 0)),
        Case([(64, 1), (64, 96)], "fb_bc_v1", (1, 0, 3)),
        Case([(1, 1), (1, 7)], "fb_bc_v1"),
        Case([(1, 96), (64, 96)], "fb_flat_v4"),  # a row vector where a column was captured: general path
        Case([(4096, 1), (4096, 4096)], "fb_bc_v4", big=True),
        Case([(4099, 1), (4099, 4093)], "fb_bc_v1", (1, 3, 2), big=True),
    ]),
    (DIAG, cuda.CudaParams("bcast", vec=4, threads=64, grid="once", unroll=2), [
        Case([(100, 1), (100, 36)], "fb_bc_v4"),
        Case([(9, 1), (9, 11)], "fb_bc_v1"),
    ]),
    (BIAS, cuda.CudaParams("bcast", vec=4, threads=32, grid="stride", unroll=2), [
        Case([(64, 96), (96,), ()], "fb_bc_v4"),
        Case([(50, 30), (30,), ()], "fb_bc_v1"),
        Case([(64, 96), (96,), ()], "fb_bc_v1", (0, 1, 0, 0)),  # the bias itself misaligned
        Case([(64, 96), (64, 1), ()], "fb_flat_v4"),
        Case([(4096, 4100), (4100,), ()], "fb_bc_v4", big=True),
    ]),
    (CHANNEL, cuda.CudaParams("bcast", vec=4, threads=64, grid="stride", unroll=2), [
        Case([(4, 8, 6, 10), (8, 1, 1), (1, 8, 1, 1)], "fb_bc_v4"),
        Case([(3, 5, 7, 7), (5, 1, 1), (1, 5, 1, 1)], "fb_bc_v1"),
        Case([(2, 8, 6, 10), (8, 1, 1), (1, 8, 1, 1)], "fb_bc_v1", (1, 0, 0, 1)),
        Case([(4, 8, 6, 10), (8, 6, 1), (1, 8, 1, 1)], "fb_flat_v4"),
        Case([(64, 128, 28, 28), (128, 1, 1), (1, 128, 1, 1)], "fb_bc_v4", big=True),
        Case([(64, 128, 7, 7), (128, 1, 1), (1, 128, 1, 1)], "fb_bc_v1", big=True),
    ]),
    (CHANNEL, cuda.CudaParams("bcast", vec=2, threads=32, grid="once", unroll=1, fast_math=True), [
        Case([(3, 6, 5, 6), (6, 1, 1), (1, 6, 1, 1)], "fb_bc_v2"),
    ]),
    (THREE, cuda.CudaParams("bcast", vec=4, threads=32, grid="stride", unroll=2), [
        Case([(20, 7, 12), (20, 1, 12), (7, 1)], "fb_bc_v4"),
        Case([(13, 5, 9), (13, 1, 9), (5, 1)], "fb_bc_v1"),
        Case([(20, 7, 12), (20, 1, 12), (7, 1)], "fb_bc_v1", (0, 1, 0, 0)),
        Case([(20, 7, 12), (20, 7, 1), (7, 1)], "fb_flat_v4"),
        Case([(512, 64, 96), (512, 1, 96), (64, 1)], "fb_bc_v4", big=True),
    ]),
    (MIXED, cuda.CudaParams("bcast", vec=4, threads=32, grid="stride", unroll=2), [
        Case([(48, 96), (96,), (48, 1), (96,)], "fb_bc_v4"),
        Case([(13, 17), (17,), (13, 1), (17,)], "fb_bc_v1"),
    ]),
    (ANY, cuda.CudaParams("flat", vec=4, threads=32, grid="stride", unroll=4), [
        Case([(2, 3, 4, 5), (3, 1, 5)], "fb_flat_v4"),
        Case([(3, 3, 4, 7), (3, 1, 7)], "fb_flat_v4"),  # 252 elements: whole vectors; the tail below
        Case([(3, 3, 5, 7), (3, 1, 7)], "fb_flat_v4"),
        Case([(2, 3, 4, 5), (3, 1, 5)], "fb_flat_v1", (1, 0, 0)),
    ]),
    (GELU, cuda.CudaParams("flat", vec=4, threads=64, grid="once", unroll=4, fast_math=True), [
        Case([(8, 100)], "fb_flat_v4"),
        Case([(7, 99)], "fb_flat_v4"),
        Case([(8, 100)], "fb_flat_v1", (0, 2)),
    ]),
]


def _check(lib: KernelLibrary, p: Program, case: Case, device: str, stream) -> None:
    gen = torch.Generator().manual_seed(0)
    offs = list(case.offset) or [0] * (len(case.shapes) + 1)
    xs = [_tensor(s, o, device, gen) for s, o in zip(case.shapes, offs, strict=False)]
    ref = _reference(p, xs)
    out = _tensor(tuple(ref.shape), offs[-1], device, gen)
    lib(xs, [out], stream)
    if device == "cuda":
        torch.cuda.synchronize()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)


def _sources() -> dict[str, str]:
    return {f"case{n}": cuda.render(p, params) for n, (p, params, _) in enumerate(CASES)}


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_flat_kernels_match_torch_on_an_emulated_gpu(tmp_path):
    srcs = _sources()
    wide = {f"case{n}-64": srcs[f"case{n}"] for n, (p, params, _) in enumerate(CASES)  # and with 64-bit indexes
            if params.grid == "stride" and p in (DIAG, THREE, ANY)}
    libs = cuda_emulation.build(srcs | wide, tmp_path, tuple(wide))
    for name, path in libs.items():
        p, params, cases = CASES[int(name.removeprefix("case").removesuffix("-64"))]
        lib = KernelLibrary(path)
        for case in (c for c in cases if not c.big):
            _check(lib, p, case, "cpu", None)
            assert cuda_emulation.last_kernel(lib) == case.kernel, (name, params.label(), case)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_flat_kernels_match_torch_on_the_gpu(tmp_path):
    major, minor = torch.cuda.get_device_capability()
    for name, src in _sources().items():
        (tmp_path / f"{name}.cu").write_text(src)
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
                        f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", "-I", str(CSRC), f"{name}.cu",
                        "-o", f"{name}.so"], cwd=tmp_path, check=True, capture_output=True)
    stream = torch.cuda.current_stream().cuda_stream
    for n, (p, _, cases) in enumerate(CASES):
        lib = KernelLibrary(tmp_path / f"case{n}.so")
        for case in cases:
            _check(lib, p, case, "cuda", stream)


def _has_avx2() -> bool:
    try:
        return " avx2 " in Path("/proc/cpuinfo").read_text().replace("\n", " ") + " "
    except OSError:
        return False


@pytest.mark.skipif(shutil.which("g++") is None or not _has_avx2(), reason="needs g++ on an x86 CPU with AVX2")
def test_the_cpu_kernel_of_a_select_is_vectorized_with_the_harness_flags(tmp_path):
    """relu's `t > 0 ? t : 0` in the flat C++ kernel: with g++'s default trapping math an AVX2 target kept it a branch
    and the loop scalar (16x slower than vectorized on a 2-core AMD EPYC, behind eager); the harness's flags
    (runner/harness/build.py CPU_FLAGS) must let the loop run 8 floats at a time."""
    from runner.catalog.codegen import cpu
    from runner.harness.build import CPU_FLAGS

    x = Load(0)
    prog = Program(inputs=[Input(0, (1024, 1024), "float32")],
                   out=Op("mul", (Op("sub", (Op("relu", (Op("add", (Op("mul", (x, Const(2.0))), Const(1.0))),)),
                                             Const(0.25))), Const(3.0))),
                   shape=(1024, 1024), axes=(), out_shape=(1024, 1024))
    params = next(p for s in strategies(prog, "cpu") for p in s.params)
    (tmp_path / "k.cpp").write_text(cpu.render(prog, params))
    flags = [f for f in CPU_FLAGS if f not in ("-shared", "-fPIC")]
    done = subprocess.run(["g++", *flags, "-S", "-I", str(CSRC), "k.cpp", "-o", "k.s"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    asm = (tmp_path / "k.s").read_text()
    run = asm[asm.index("fb_run"):]
    assert "%ymm" in run or "%zmm" in run, "the flat loop was not vectorized"
