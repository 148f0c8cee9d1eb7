"""Sizes come from the call: a source rendered for one captured shape serves other row counts and row lengths in every
layout that fixes nothing (`// fusebot-sizes: in0=d0,d1 in1=d1 in2=d1`), on the emulated GPU
(tests/runner/cuda_emulation.py, threaded: the row layouts merge across lanes and warps)."""

from __future__ import annotations

import shutil

import pytest
import torch

from runner.catalog.codegen import cuda
from runner.harness.procs.abi import KernelLibrary
from tests.runner import cuda_emulation
from tests.runner.catalog.codegen import programs

CAPTURED = programs.layernorm(6, 256)
LAYOUTS = [cuda.CudaParams("rows", vec=4, threads=64, group=32, mode="online"),
           cuda.CudaParams("rows", vec=4, threads=64, group=0, mode="twopass"),
           cuda.CudaParams("split", vec=4, threads=32, slices=3, mode="online", unroll=2),
           cuda.CudaParams("columns", vec=1, threads=64, col_width=32, slices=2, mode="twopass")]
SHAPES = [(6, 256), (11, 200), (2, 1000), (1, 12)]  # rows x row length, none a multiple of the captured ones


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_a_row_kernel_serves_other_row_counts_and_lengths(tmp_path):
    srcs = {f"l{k}": cuda.render(CAPTURED, p) for k, p in enumerate(LAYOUTS)}
    assert all(src.splitlines()[2] == "// fusebot-sizes: in0=d0,d1 in1=d1 in2=d1" for src in srcs.values())
    libs = cuda_emulation.build(srcs, tmp_path, threaded=tuple(srcs))
    gen = torch.Generator().manual_seed(1)
    for k, params in enumerate(LAYOUTS):
        lib = KernelLibrary(libs[f"l{k}"])
        for rows, n in SHAPES:
            x, w, b = torch.randn(rows, n, generator=gen), torch.randn(n, generator=gen), torch.randn(n, generator=gen)
            out = torch.empty(rows, n)
            lib([x, w, b], [out], None)
            want = torch.nn.functional.layer_norm(x, (n,), w, b, 1e-5)
            torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4, msg=lambda m, p=params, s=(rows, n):
                                       f"{p.label()} on {s}: {m}")
