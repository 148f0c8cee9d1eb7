"""The CUDA `strided` layout (runner/catalog/codegen/cuda/rows.py): a middle dim reduced with V-wide loads where the inner
dim is not whole vectors. Its two kernels have no barriers or shuffles, so the emulated GPU of
tests/runner/cuda_emulation.py runs them exactly: values against torch on shapes whose period is 4, 2 or 1 rows,
ties in argmax, several groups per column; the host's fall-back to the scalar columns kernel by name (that kernel
merges through shared memory at barriers: checked on a GPU, pytest -m gpu tests/runner/catalog/test_catalog.py)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from runner.catalog.codegen import cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.space import strategies
from runner.harness.procs.abi import KernelLibrary
from runner.proposers.catalog import CatalogProposer
from runner.search.types import ProblemContext
from tests.runner import cuda_emulation

CATALOG = Path(__file__).resolve().parents[2] / "fixtures/problems/catalog"


def _program(name: str):
    prop = CatalogProposer()
    return prop.pattern(ProblemContext(name=name, reference_source=(CATALOG / f"{name}.py").read_text(),
                                       backend="cuda")).program


def _grid(shape, gen, offset: int = 0) -> torch.Tensor:
    n = 1
    for s in shape:
        n *= s
    flat = torch.round(torch.randn(n + offset, generator=gen) * 2) / 2  # ties: the first index must win
    return flat[offset:].view(shape)


def test_the_strided_layout_is_proposed_first_only_where_the_inner_dim_is_not_whole_vectors():
    odd, even = _program("argmax_middle"), _program("sum_dim")  # inner 45 and 40
    ss = strategies(odd, "cuda")
    assert ss[0].key == "cuda-columns-strided" and all(p.layout == "strided" for p in ss[0].params)
    assert "cuda-columns-strided" not in [s.key for s in strategies(even, "cuda")]
    assert "cuda-columns-strided" not in [s.key for s in strategies(_program("rmsnorm"), "cuda")]  # a full output
    with pytest.raises(NotExpressible):
        cuda.render(_program("layernorm"), cuda.CudaParams("strided", vec=4, threads=256, slices=4))
    assert cuda.CudaParams("strided", vec=4, threads=256, slices=4, unroll=8).label() == "cuda-strided-v4-t256-g4-u8"


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_strided_kernels_match_torch_on_an_emulated_gpu(tmp_path):
    params = {"s4": cuda.CudaParams("strided", vec=4, threads=32, slices=3, unroll=4),
              "s2": cuda.CudaParams("strided", vec=2, threads=64, slices=1, unroll=1)}
    progs = {"argmax": _program("argmax_middle"), "mean": _program("mean_middle")}
    srcs = {f"{n}-{k}": cuda.render(p, q) for n, p in progs.items() for k, q in params.items()}
    libs = {k: KernelLibrary(v) for k, v in cuda_emulation.build(srcs, tmp_path).items()}
    gen = torch.Generator().manual_seed(0)
    ref = {"argmax": lambda x: torch.argmax(x, dim=1), "mean": lambda x: torch.mean(x, dim=1, keepdim=True)}
    # (shape, input offset in elements, the kernel the host must pick for V = 4 / V = 2)
    cases = [((6, 96, 45), 0, "fb_strd_fin", "fb_strd_fin"),  # gcd(45, 4) = 1: periods of 4 rows
             ((3, 40, 46), 0, "fb_strd_fin", "fb_strd_fin"),  # gcd 2: periods of 2 rows, of 1 row at V = 2
             ((2, 24, 40), 0, "fb_strd_fin", "fb_strd_fin"),  # whole vectors: a period of one row
             ((4, 8, 7), 0, "fb_strd_fin", "fb_strd_fin"),  # 2 periods, 3 groups at V = 4: one group empty
             ((3, 30, 45), 0, "fb_cols_v1", "fb_strd_fin"),  # 30 rows: not whole periods of 4
             ((6, 96, 45), 1, "fb_cols_v1", "fb_cols_v1")]  # misaligned
    for shape, off, k4, k2 in cases:
        x = _grid(shape, gen, off)
        for n in progs:
            want = ref[n](x)
            for k, kernel in (("s4", k4), ("s2", k2)):
                lib = libs[f"{n}-{k}"]
                out = torch.full_like(want, -7 if n == "argmax" else float("nan"))
                lib([x], [out], None)
                assert cuda_emulation.last_kernel(lib) == kernel, (n, k, shape, off)
                if kernel == "fb_strd_fin":
                    if n == "argmax":
                        assert torch.equal(out, want), (k, shape)
                    else:
                        torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)
