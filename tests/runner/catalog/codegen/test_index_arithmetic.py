"""Index arithmetic of the generated kernels: an integer index input (token or position ids) is never rounded
through a float."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from runner.catalog.codegen import cpu, cuda
from runner.catalog.ir import Gather, Input, Iota, Load, Op, Program

CSRC = Path(__file__).resolve().parents[4] / "runner/csrc"
BIG = (1 << 24) + 8  # rows of a table past the last integer a float holds exactly (2^24)


def _lookup(rows: int, width: int) -> Program:
    """out[b, t, :] = table[ids[b, t], :] + pos[t, :]: GPT-2's embeddings (a gather by id, one by position), the
    shape of GPT-J's cos/sin lookup by position ids."""
    return Program(
        inputs=[Input(0, (2, 4, 1), "int64", viewed=True, tensor=(2, 4)),
                Input(1, (1, 1, width), "float32", viewed=True, strides=(0, 0, 1), shift=(0, 0, 0), base=rows * width,
                      tensor=(rows, width)),
                Input(2, (1, 1, width), "float32", viewed=True, strides=(0, 0, 1), shift=(0, 0, 0), base=4 * width,
                      tensor=(4, width))],
        out=Op("add", (Gather(Load(1), Load(0), width), Gather(Load(2), Iota(1), width))), shape=(2, 4, width),
        axes=(), out_dtype="float32", out_shape=(2, 4, width))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_an_id_past_2_24_indexes_its_own_row(tmp_path):
    """Ids 2^24 + 1, + 3, + 5 (a float rounds each to an even neighbour) read their own rows of a 2^24 + 8 row table:
    the C++ kernel run through the fast ABI equals torch's gather exactly; the CUDA source shares the expression."""
    from runner.harness.build import CPU_FLAGS
    from runner.harness.procs.abi import KernelLibrary

    prog = _lookup(BIG, 1)
    (tmp_path / "k.cpp").write_text(cpu.render(prog, cpu.CpuParams("flat", threads="one")))
    done = subprocess.run(["g++", *CPU_FLAGS, "-I", str(CSRC), "k.cpp", "-o", "k.so"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    table = (torch.arange(BIG, dtype=torch.int64) % 1000).to(torch.float32).reshape(BIG, 1)
    pos = torch.tensor([[0.5], [1.5], [2.5], [3.5]])
    ids = torch.tensor([[(1 << 24) + 1, (1 << 24) + 3, (1 << 24) + 5, (1 << 24) + 7], [3, BIG - 1, 0, (1 << 24) - 1]])
    out = torch.empty(2, 4, 1)
    KernelLibrary(tmp_path / "k.so")([ids, table, pos], [out], None)
    want = table[ids] + pos[None]
    torch.testing.assert_close(out, want, rtol=0, atol=0)
    for params in (cuda.CudaParams("flat", vec=1, threads=256, grid="once"), cuda.CudaParams("flat", vec=4)):
        src = cuda.render(prog, params)
        gathers = [line for line in src.splitlines() if "a.in[1] +" in line]
        assert gathers and all(re.search(r"\(long long\)\((v0|\(\(const long long\*\))", g) for g in gathers), gathers
        assert not re.search(r"\(long long\)t\d", src), "an index rounded through a float temporary"
