"""CUDA IPC between two processes (GPU; skipped without CUDA): the bytes arrive intact, a record that points outside
the exporter's allocation is refused, and without a GPU the module says it is unavailable instead of failing."""

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from runner.harness.procs import ipc

EXPORTER = textwrap.dedent("""
    import json, sys, torch
    from runner.harness.procs import ipc
    big = torch.empty(1 << 20, device="cuda")          # the tensor lives inside a larger cached segment
    t = big[4096:4096 + 1000].copy_(torch.arange(1000, device="cuda", dtype=torch.float32) * 0.5)
    print(json.dumps(ipc.export(t)), flush=True)
    sys.stdin.readline()                                # keep the memory alive until the parent has copied it
""")


def test_export_refuses_host_tensors():
    with pytest.raises(ipc.IpcUnavailable):
        ipc.export(torch.ones(4))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_tensor_crosses_processes_and_a_forged_record_is_refused():
    import json

    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen([sys.executable, "-c", EXPORTER], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                            env=env)
    try:
        record = json.loads(proc.stdout.readline())
        got = ipc.receive(record, "cuda").view(torch.float32)
        assert torch.equal(got, torch.arange(1000, device="cuda", dtype=torch.float32) * 0.5)
        with pytest.raises(ValueError, match="outside"):
            ipc.receive({**record, "offset": record["offset"] + (1 << 40)}, "cuda")
    finally:
        proc.communicate("\n", timeout=60)
