"""On the GPU (run by hand: `pytest -m gpu`): short-row LayerNorm and RMSNorm through the `regs` layout, verified
against eager and timed against eager, torch.compile and the `rows` layout's warp per row.

Each case compiles every parameter set short_row_params proposes (and two `rows` sets) for the GPU's own
architecture, checks each output against eager (fp32: 1e-5; bf16: within one bf16 step of the fp32 result of the
bf16 inputs, as eager is), and times each kernel, eager and torch.compile by CUDA events (median of 50 calls after
10 warm-up calls, every call on fresh-enough data: the tensors are larger than L2). The table goes to the log
(`-o log_cli=true --log-cli-level=INFO` shows it) and, where FUSEBOT_GPU_TABLE names a file, as JSON lines there.
The test fails where a kernel is wrong, or where the best `regs` set is slower than torch.compile by more than 10%
(the catalog's target for short rows is to be at least level with it)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from runner.catalog.codegen import cuda
from runner.catalog.codegen.cuda.regs import short_row_params
from runner.harness.procs.abi import KernelLibrary
from tests.runner.catalog.codegen import programs
from tests.runner.catalog.codegen.nvcc import CSRC

log = logging.getLogger(__name__)
DT = {"float32": torch.float32, "bfloat16": torch.bfloat16}
CASES = [  # (norm, rows, row length, dtype)
    ("layernorm", 32768, 1024, "float32"), ("layernorm", 32768, 1024, "bfloat16"),
    ("rmsnorm", 32768, 1024, "float32"), ("rmsnorm", 32768, 1024, "bfloat16"),
    ("layernorm", 16384, 2048, "bfloat16"), ("rmsnorm", 65536, 512, "bfloat16"),
]


def _eager(norm: str, xs: list[torch.Tensor]) -> torch.Tensor:
    x = xs[0]
    if norm == "layernorm":
        return torch.nn.functional.layer_norm(x, x.shape[-1:], xs[1], xs[2], 1e-5)
    h = x.float()  # (as Llama's RMSNorm: statistics in fp32, the result cast back before the weight)
    return xs[1] * (h * torch.rsqrt(h.square().mean(-1, keepdim=True) + 1e-6)).to(x.dtype)


def _median_ms(fn, reps: int = 50) -> float:
    for _ in range(10):
        fn()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return sorted(times)[len(times) // 2]


def _build(sources: dict[str, str], where: Path) -> dict[str, KernelLibrary]:
    major, minor = torch.cuda.get_device_capability()
    procs = {}
    for name, src in sources.items():
        (where / f"{name}.cu").write_text(src)
        procs[name] = subprocess.Popen(
            ["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC",
             f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", "-I", str(CSRC), f"{name}.cu",
             "-o", f"{name}.so"], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    for name, p in procs.items():
        out, _ = p.communicate(timeout=600)
        assert p.returncode == 0, (name, out[-3000:])
    return {name: KernelLibrary(where / f"{name}.so") for name in sources}


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or shutil.which("nvcc") is None, reason="needs a CUDA GPU and nvcc")
@pytest.mark.parametrize("norm,rows,n,dtype", CASES)
def test_short_row_norms_reach_torch_compile(norm, rows, n, dtype, tmp_path):
    prog = getattr(programs, norm)(rows, n, dtype)
    sets = short_row_params(prog)
    assert sets
    rows_sets = [cuda.CudaParams("rows", vec=sets[0].vec, threads=256, group=32, mode="twopass"),
                 cuda.CudaParams("rows", vec=sets[0].vec, threads=256, group=0, mode="twopass")]
    params = {p.label(): p for p in sets + rows_sets}
    libs = _build({label: cuda.render(prog, p) for label, p in params.items()}, tmp_path)

    gen = torch.Generator(device="cuda").manual_seed(0)
    xs = [torch.randn(rows, n, device="cuda", generator=gen).to(DT[dtype])]
    xs += [(1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(DT[dtype])
           for _ in range(2 if norm == "layernorm" else 1)]
    want = _eager(norm, xs)
    exact = _eager(norm, [x.double() for x in xs]).float()  # (fp64 from the same stored inputs)
    stream = torch.cuda.current_stream().cuda_stream
    out = torch.empty_like(want)
    rows_out = []
    for label, lib in libs.items():
        out.zero_()
        lib(xs, [out], stream)
        torch.cuda.synchronize()
        if dtype == "float32":
            torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5, msg=lambda m, k=label: f"{k}: {m}")
        else:  # no further from the fp64 value than eager is, give or take one bf16 step
            err, ref_err = (out.float() - exact).abs(), (want.float() - exact).abs()
            step = exact.abs().clamp_min(1e-2) * 2.0 ** -7
            assert bool((err <= ref_err + step).all()), (label, float((err - ref_err).max()))
        rows_out.append((label, _median_ms(lambda lib=lib: lib(xs, [out], stream))))
    eager_ms = _median_ms(lambda: _eager(norm, xs))
    compiled = torch.compile(lambda *t: _eager(norm, list(t)), dynamic=False)
    compile_ms = _median_ms(lambda: compiled(*xs))
    moved = sum(x.numel() * x.element_size() for x in xs) + want.numel() * want.element_size()
    table = {"norm": norm, "rows": rows, "n": n, "dtype": dtype, "bytes_moved": moved, "eager_ms": eager_ms,
             "compile_ms": compile_ms, "kernels_ms": dict(rows_out), "gpu": torch.cuda.get_device_name()}
    log.info("%s %dx%d %s: eager %.4f ms, torch.compile %.4f ms, %s", norm, rows, n, dtype, eager_ms, compile_ms,
             ", ".join(f"{k} {v:.4f}" for k, v in sorted(rows_out, key=lambda kv: kv[1])))
    if os.environ.get("FUSEBOT_GPU_TABLE"):
        with open(os.environ["FUSEBOT_GPU_TABLE"], "a") as f:
            f.write(json.dumps(table) + "\n")
    best_regs = min(ms for label, ms in rows_out if label.startswith("cuda-regs"))
    assert best_regs <= 1.10 * compile_ms, table
