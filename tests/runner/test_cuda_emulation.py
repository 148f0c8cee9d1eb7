"""The CUDA emulator itself (tests/runner/cuda_emulation.py), threaded mode: a block's shared-memory tree sum with its
barriers is the row's sum, without them it is wrong on every run (its threads run in a fixed order), a warp's shuffles
exchange the lanes' values, and a block whose threads each wait at a barrier that no other thread reaches stops the
process with a message instead of hanging."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
import torch

from runner.harness.procs.abi import KernelLibrary
from tests.runner import cuda_emulation

# one block of 64 threads a row: each thread loads one element into shared memory, then a tree sum; lane 0 also
# writes its warp's shuffled sum (xor 1..16) to the second output
SOURCE = r"""#include "fusebot.h"
#include <cuda_runtime.h>
__global__ void row_sum(const float* x, float* out, float* warp0) {
  __shared__ float s[64];
  const int t = threadIdx.x;
  s[t] = x[blockIdx.x * 64 + t];
  SYNC
  for (int k = 32; k > 0; k /= 2) {
    if (t < k) s[t] += s[t + k];
    SYNC
  }
  if (t == 0) out[blockIdx.x] = s[0];
  if (t < 32) {
    int v = (int)x[blockIdx.x * 64 + t];
    for (int off = 1; off < 32; off *= 2) v += __shfl_xor_sync(0xffffffffu, v, off);
    if (t == 0) warp0[blockIdx.x] = (float)v;
  }
  STALL
}
extern "C" int fusebot_forward(const fb_tensor* in, int32_t, fb_tensor* out, int32_t, void* stream) {
  row_sum<<<(unsigned)in[0].shape[0], 64, 0, (cudaStream_t)stream>>>((const float*)in[0].data, (float*)out[0].data,
                                                                     (float*)out[1].data);
  return 0;
}
"""
VARIANTS = {"synced": ("__syncthreads();", ""), "unsynced": ("", ""),
            # lane 5 waits for a shuffle that its warp never joins, the others at the block's barrier
            "stalled": ("__syncthreads();", "if (t == 5) __shfl_xor_sync(0xffffffffu, 1, 1);\n  __syncthreads();")}


@pytest.fixture(scope="module")
def libs(tmp_path_factory):
    if shutil.which("g++") is None:
        pytest.skip("g++ is not installed")
    srcs = {k: SOURCE.replace("SYNC", sync).replace("STALL", stall) for k, (sync, stall) in VARIANTS.items()}
    return cuda_emulation.build(srcs, tmp_path_factory.mktemp("emu"), threaded=tuple(srcs))


def _call(path, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    out, warp0 = torch.full((x.shape[0],), -1.0), torch.full((x.shape[0],), -1.0)
    KernelLibrary(path)([x], [out, warp0], None)
    return out, warp0


def test_barriers_and_shuffles_merge_a_blocks_threads(libs):
    x = torch.randint(-8, 8, (5, 64)).float()
    out, warp0 = _call(libs["synced"], x)
    assert torch.equal(out, x.sum(1)) and torch.equal(warp0, x[:, :32].sum(1))
    for _ in range(2):  # without its barriers each thread reads its partners' slots before they are written
        out, _ = _call(libs["unsynced"], x)
        assert not torch.equal(out, x.sum(1)), out


def test_a_block_deadlocked_at_a_barrier_stops_with_a_message(libs):
    code = ("import torch; from runner.harness.procs.abi import KernelLibrary; "
            f"KernelLibrary({str(libs['stalled'])!r})([torch.ones(2, 64)], [torch.empty(2), torch.empty(2)], None)")
    p = subprocess.run([sys.executable, "-c", code], cwd=cuda_emulation.ROOT, capture_output=True, text=True,
                       timeout=120)
    assert p.returncode != 0 and "block 0 deadlocked: 64 threads wait at barriers" in p.stderr, p.stderr[-2000:]
