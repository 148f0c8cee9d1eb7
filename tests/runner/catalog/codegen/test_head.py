"""The set-up at the head of every generated source (runner/catalog/codegen/head.py): F's sizes from the call's
tensors, and the captured size of a dim no input spans."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch

from runner.catalog.codegen import cpu, cuda
from runner.catalog.ir import Input, Load, Program
from runner.catalog.sizes import free_f_dims, sizes_line
from runner.harness.build import CPU_FLAGS
from runner.harness.procs.abi import AbiError, KernelLibrary

ROOT = Path(__file__).resolve().parents[4]


def expanded_to_batch(batch: int = 2, half: int = 8) -> Program:
    """Llama's rotary embedding where transformers expands the inverse frequencies to the batch before a matmul:
    `inv_freq[None, :, None].expand(B, -1, 1).to(torch.float)` of a bf16 buffer is a stage of its own (the matmul stays
    on torch), whose dim 0 (the batch) no input spans: its size is the captured one."""
    inv = Input(0, (1, half, 1), "bfloat16", viewed=True, tensor=(half,))
    return Program(inputs=[inv], out=Load(0), shape=(batch, half, 1), out_dtype="float32",
                   out_shape=(batch, half, 1))


def _build(src: str, where: Path) -> KernelLibrary:
    (where / "k.cpp").write_text(src)
    subprocess.run(["g++", *CPU_FLAGS, "-I", str(ROOT / "runner/csrc"), "k.cpp", "-o", "k.so"], cwd=where, check=True,
                   capture_output=True, timeout=300)
    return KernelLibrary(where / "k.so")


def test_a_dim_no_input_spans_is_fixed_and_set_up_at_its_captured_size():
    """The batch is read from no tensor: the line fixes it, and the set-up (the CPU's and the GPU's alike) takes it
    from the captured sizes rather than from the inputs' broadcast (1); a dim an input spans keeps 1 there (its size
    comes from the call)."""
    p = expanded_to_batch()
    assert free_f_dims(p) == {1}
    assert sizes_line(p) == "// fusebot-sizes: in0=d1"
    for src in (cpu.render(p, cpu.CpuParams("flat", threads="one")),
                cuda.render(p, cuda.CudaParams(layout="flat", mode="online"))):
        assert "const long long fcap[3] = {2LL, 1LL, 1LL};" in src
        assert "a.F[d] = seen ? f : fcap[d];" in src


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_an_expand_to_the_captured_batch_runs_and_another_batch_is_refused(tmp_path):
    p = expanded_to_batch()
    lib = _build(cpu.render(p, cpu.CpuParams("flat", threads="one")), tmp_path)
    for half in (8, 5):  # the frequencies follow the call's tensor (dim 1 is free)
        inv = torch.randn(half).to(torch.bfloat16)
        out = torch.empty(2, half, 1)
        lib([inv], [out], None)
        torch.testing.assert_close(out, inv[None, :, None].expand(2, -1, 1).to(torch.float), rtol=0, atol=0)
    with pytest.raises(AbiError, match="output 0: size differs"):  # only the output would say 3
        lib([torch.randn(8).to(torch.bfloat16)], [torch.empty(3, 8, 1)], None)
