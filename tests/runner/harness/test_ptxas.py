"""What ptxas reports of each CUDA kernel (registers, spills, shared memory) goes into the build's record, survives
the build cache, and reaches the report and the next round's prompt. nvcc compiles here without a GPU."""

from __future__ import annotations

import shutil

import pytest

from runner.contract import BuildInfo, Candidate, KernelResources, Verdict
from runner.harness import build, ptxas
from runner.proposers.llm.prompts import _attempt_line
from runner.search.types import Attempt
from tests.fakes.evaluators import timing

# as nvcc 13 prints it for a kernel that spills (the numbers differ from the real run below on purpose)
SPILLING = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function '_Z6spillsPKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z6spillsPKfPfi
    48 bytes stack frame, 40 bytes spill stores, 36 bytes spill loads
ptxas info    : Used 255 registers, used 1 barriers, 2048 bytes smem
ptxas info    : Compile time = 10.955 ms
ptxas info    : Compiling entry function '_Z4tidyPKfPfi' for 'sm_90'
ptxas info    : Function properties for _Z4tidyPKfPfi
    0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
ptxas info    : Used 10 registers, used 0 barriers
"""

KERNEL = r'''#include "fusebot.h"
__global__ void mirror(const float* __restrict__ x, float* __restrict__ y) {
  __shared__ float s[256];
  s[threadIdx.x] = x[threadIdx.x];
  __syncthreads();
  y[threadIdx.x] = s[255 - threadIdx.x];
}
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  mirror<<<1, 256, 0, (cudaStream_t)stream>>>((const float*)in[0].data, (float*)out[0].data);
  return 0;
}
'''


def test_each_kernels_registers_spills_and_shared_memory_are_read_from_ptxas():
    spills, tidy = ptxas.parse(SPILLING)
    assert spills == KernelResources(name="_Z6spillsPKfPfi", registers=255, spill_stores_bytes=40,
                                     spill_loads_bytes=36, stack_bytes=48, shared_bytes=2048, barriers=1)
    assert tidy == KernelResources(name="_Z4tidyPKfPfi", registers=10)
    assert "ptxas info" not in ptxas.without_info(SPILLING) and "spill" not in ptxas.without_info(SPILLING)
    assert BuildInfo(ok=True, seconds=1.0, kernels=[spills]).kernels_text() == (
        "_Z6spillsPKfPfi: 255 registers, 76 B spilled, 2048 B shared, 48 B stack")


@pytest.mark.skipif(shutil.which("nvcc") is None or shutil.which("bwrap") is None, reason="needs nvcc and bubblewrap")
def test_a_cuda_build_records_what_ptxas_said_and_a_cached_build_still_has_it(tmp_path):
    c = Candidate(id="m", format="fast", backend="cuda", sources={"kernel.cu": KERNEL})
    first = build.build(c, cache_dir=tmp_path / "cache")
    assert first.info.ok, first.info.log
    [k] = first.info.kernels
    assert "mirror" in k.name and 0 < k.registers <= 255 and k.shared_bytes == 1024 and k.barriers == 1
    assert "ptxas info" not in first.info.log
    again = build.build(c, cache_dir=tmp_path / "cache")
    assert again.info.cached and again.info.kernels == first.info.kernels


def test_the_next_rounds_prompt_shows_a_verified_kernels_resources():
    v = Verdict(candidate_id="c", problem="p", accepted=True, stage="done",
                build=BuildInfo(ok=True, seconds=1.0, kernels=ptxas.parse(SPILLING)[:1]),
                timing=timing(0.5))
    a = Attempt(round=1, proposer="m", idea="tile it", verdict=v,
                candidate=Candidate(id="c", format="fast", backend="cuda", sources={"kernel.cu": KERNEL}))
    line = _attempt_line(a, base_ms=1.0, floor_ms=0.25)
    assert "2.00x the faster baseline" in line and "50% of the roofline floor" in line
    assert "ptxas: _Z6spillsPKfPfi: 255 registers, 76 B spilled, 2048 B shared" in line
