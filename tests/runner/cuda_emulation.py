"""Run a catalog CUDA source's flat kernels on the CPU: the source compiled by g++ against stub CUDA headers, each
`kernel<<<blocks, threads, 0, s>>>(args)` turned into a loop calling the kernel once per (block, thread).

Exact for kernels without shared memory, barriers or warp shuffles (the `flat` and `bcast` layouts): each thread's
work does not depend on any other's. It checks what a CPU-only machine cannot otherwise run: the host code that picks
a kernel and sizes its grid, the kernels' index arithmetic, vector paths, tails and fall-backs, all on CPU tensors
through the same C ABI. A small emulated GPU (3 SMs, 2 resident blocks each) makes grid-stride loops take several
steps."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CSRC = ROOT / "runner/csrc"

SMS, BLOCKS_PER_SM = 3, 2

CUDA_RUNTIME = r"""#pragma once
#include <math.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#include <stdlib.h>
struct dim3 { unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {} };
static dim3 threadIdx, blockIdx, blockDim, gridDim;
struct uint4 { unsigned x, y, z, w; };
struct uint2 { unsigned x, y; };
template <typename T> static inline T __ldg(const T* p) { return *p; }
typedef void* cudaStream_t;
typedef int cudaError_t;
enum { cudaSuccess = 0, cudaDevAttrMultiProcessorCount = 16 };
static inline cudaError_t cudaGetLastError() { return cudaSuccess; }
static inline cudaError_t cudaMallocAsync(void** p, size_t n, cudaStream_t) { *p = malloc(n); return *p ? 0 : 2; }
static inline cudaError_t cudaFreeAsync(void* p, cudaStream_t) { free(p); return cudaSuccess; }
static inline const char* cudaGetErrorString(cudaError_t) { return "no error"; }
static inline cudaError_t cudaGetDevice(int* d) { *d = 0; return cudaSuccess; }
static inline cudaError_t cudaDeviceGetAttribute(int* v, int, int) { *v = FB_EMU_SMS; return cudaSuccess; }
template <typename K> static inline cudaError_t cudaOccupancyMaxActiveBlocksPerMultiprocessor(int* n, K, int, size_t) {
  *n = FB_EMU_BLOCKS_PER_SM; return cudaSuccess; }
static inline void __syncthreads() {}
static inline int __shfl_xor_sync(unsigned, int v, int) { return v; }
#define __expf(x) expf(x)  /* (glibc declares these two without exporting them) */
#define __logf(x) logf(x)
static inline float __fdividef(float x, float y) { return x / y; }
static const char* fb_emu_kernel = "";  // the last kernel launched, by name
extern "C" __attribute__((visibility("default"))) const char* fb_emu_last_kernel(void) { return fb_emu_kernel; }
template <typename K, typename... A> static void fb_emu_launch(const char* name, K kernel, unsigned blocks, int threads,
                                                             int, cudaStream_t, A... args) {
  fb_emu_kernel = name;
  gridDim.x = blocks; blockDim.x = (unsigned)threads; blockDim.y = 1; threadIdx.y = 0;
  for (unsigned b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) { blockIdx.x = b; threadIdx.x = (unsigned)t; kernel(args...); }
}
// a 2-D block: recorded and run thread by thread, which is exact only for kernels whose threads never wait on each
// other (a block that merges through shared memory at a barrier is named here but not emulated faithfully)
template <typename K, typename... A> static void fb_emu_launch(const char* name, K kernel, unsigned blocks, dim3 threads,
                                                             int, cudaStream_t, A... args) {
  fb_emu_kernel = name;
  gridDim.x = blocks; blockDim = threads;
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned y = 0; y < threads.y; ++y)
      for (unsigned t = 0; t < threads.x; ++t) { blockIdx.x = b; threadIdx.x = t; threadIdx.y = y; kernel(args...); }
}
""".replace("FB_EMU_SMS", str(SMS)).replace("FB_EMU_BLOCKS_PER_SM", str(BLOCKS_PER_SM))

HALF = r"""#pragma once
struct __half { float f; };
static inline float __half2float(__half h) { return h.f; }
static inline __half __float2half_rn(float f) { return __half{f}; }
"""

BF16 = r"""#pragma once
struct __nv_bfloat16 { float f; };
static inline float __bfloat162float(__nv_bfloat16 h) { return h.f; }
static inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16{f}; }
"""

HEADERS = {"cuda_runtime.h": CUDA_RUNTIME, "cuda_fp16.h": HALF, "cuda_bf16.h": BF16,
           "cooperative_groups.h": "#pragma once\nnamespace cooperative_groups {}\n",
           "cuda_pipeline.h": "#pragma once\n"}  # cp.async: only the cluster layout uses it, never emulated

_LAUNCH = re.compile(r"(\w+)<<<([^;]*?)>>>\(([^;]*?)\);")


def emulated(src: str, wide_index: bool = False) -> str:
    """The CUDA source with its launches turned into calls of the emulator, which records the last kernel's name for
    `fb_emu_last_kernel()` (fp32 programs: the half types are stand-ins that only have to compile). `wide_index`: the
    64-bit index paths even for small tensors (those of more than 2^31 elements)."""
    if wide_index:
        assert "a.small = a.N < 0x7fffffffLL;" in src
        src = src.replace("a.small = a.N < 0x7fffffffLL;", "a.small = 0;")
    return _LAUNCH.sub(lambda m: f'fb_emu_launch("{m.group(1)}", {m.group(1)}, {m.group(2)}, {m.group(3)});', src)


def build(sources: dict[str, str], where: Path, wide_index: tuple[str, ...] = ()) -> dict[str, Path]:
    """One shared library per source (name -> path), compiled in one g++ run each, in parallel; the sources named in
    `wide_index` take their 64-bit index paths."""
    inc = where / "emu_include"
    inc.mkdir(parents=True, exist_ok=True)
    for name, text in HEADERS.items():
        (inc / name).write_text(text)
    procs, out = [], {}
    for name, src in sources.items():
        (where / f"{name}.cpp").write_text(emulated(src, name in wide_index))
        out[name] = where / f"{name}.so"
        procs.append(subprocess.Popen(
            ["g++", "-O0", "-std=c++17", "-shared", "-fPIC", "-w", "-I", str(inc), "-I", str(CSRC), f"{name}.cpp",
             "-o", out[name].name], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    for (name, _), p in zip(sources.items(), procs, strict=True):
        log, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{name}: g++ failed:\n{log[-3000:]}")
    return out


def last_kernel(lib) -> str:
    """The name of the kernel the library's last fusebot_forward launched (a runner.harness.procs.abi.KernelLibrary)."""
    import ctypes

    fn = lib.lib.fb_emu_last_kernel
    fn.restype = ctypes.c_char_p
    return fn().decode()
