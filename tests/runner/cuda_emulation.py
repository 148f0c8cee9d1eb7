"""Run a catalog CUDA source's kernels on the CPU: the source compiled by g++ against stub CUDA headers, each
`kernel<<<blocks, threads, 0, s>>>(args)` turned into a call of the emulator.

Two modes. Sequential (the default): the kernel called once per (block, thread), exact for kernels without shared
memory, barriers or warp shuffles (the `flat` and `bcast` layouts): each thread's work does not depend on any other's.
Threaded (`build(..., threaded=names)`): a block's threads run as fibers of one OS thread (ucontext), each until it
waits at a barrier or returns, `__syncthreads()` a barrier of the block, `__shfl_xor_sync` an exchange through a
barrier of the warp, `__shared__` variables shared by the block (blocks run one after another): exact for kernels whose
warps merge by shuffles and shared memory (the `regs` and `rows` layouts), given that every lane of a warp reaches
each shuffle, as on the GPU. The order is fixed, so a missing barrier gives the same wrong values on every run (each
thread runs to its next barrier before the next thread of its block resumes), and a block whose threads all wait at
barriers that no other thread reaches aborts with a message instead of hanging. Fibers, not OS threads: a barrier is
a switch of stacks instead of a wake-up across cores (one call of each of the constructs test's 39 sources: 30 s of
CPU as OS threads, 2.5 s as fibers), and the build needs no <thread> or <barrier> (a source's g++ run: 0.6 s against
0.2). Neither mode emulates cp.async, clusters or cooperative launches.

It checks what a CPU-only machine cannot otherwise run: the host code that picks a kernel and sizes its grid, the
kernels' index arithmetic, vector paths, tails and fall-backs, all on CPU tensors through the same C ABI. A small
emulated GPU (3 SMs, 2 resident blocks each) makes grid-stride loops take several steps."""

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
#define __CUDACC__ 1  /* a CUDA source (device code without __CUDA_ARCH__: the host's paths) */
#define __global__
#define __device__
#define __host__
#define __forceinline__ inline
#define __shared__ static
#define __launch_bounds__(...)
#include <stdlib.h>
struct dim3 { unsigned x = 1, y = 1, z = 1;
  dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {} };
static dim3 threadIdx, blockIdx;
static dim3 blockDim, gridDim;
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
#ifdef FB_EMU_THREADED
#include <stdio.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
// A block's threads are fibers of one OS thread: the scheduler resumes each in turn, and each runs until it waits at
// a barrier or returns. A barrier completes its phase when every thread it counts has arrived; a thread that returns
// leaves every barrier (the others no longer wait for it).
struct fb_emu_bar { unsigned expected, arrived, phase; };
enum { FB_EMU_MAX_THREADS = 1024, FB_EMU_STACK = 256 * 1024 };
static fb_emu_bar fb_emu_block_bar, fb_emu_warp_bar[FB_EMU_MAX_THREADS / 32];
static int fb_emu_slots[FB_EMU_MAX_THREADS / 32][32];  // a word per lane of each warp
static ucontext_t fb_emu_sched, fb_emu_ctx[FB_EMU_MAX_THREADS];
static bool fb_emu_done[FB_EMU_MAX_THREADS];
static unsigned fb_emu_current;
static unsigned long fb_emu_events;  // arrivals and returns: a round of the scheduler without one is a deadlock
static void (*fb_emu_body)(void*);
static void* fb_emu_body_arg;
static inline void fb_emu_arrive_and_wait(fb_emu_bar& b) {
  ++fb_emu_events;
  if (++b.arrived == b.expected) { b.arrived = 0; ++b.phase; return; }
  const unsigned phase = b.phase;
  while (b.phase == phase) swapcontext(&fb_emu_ctx[fb_emu_current], &fb_emu_sched);
}
static inline void fb_emu_arrive_and_drop(fb_emu_bar& b) {
  ++fb_emu_events;
  if (--b.expected > 0 && b.arrived == b.expected) { b.arrived = 0; ++b.phase; }
}
static inline unsigned fb_emu_tid() { return threadIdx.x + threadIdx.y * blockDim.x; }
static inline void __syncthreads() { fb_emu_arrive_and_wait(fb_emu_block_bar); }
static inline int __shfl_xor_sync(unsigned, int v, int off) {
  const unsigned w = fb_emu_tid() / 32, l = fb_emu_tid() % 32;
  fb_emu_slots[w][l] = v;
  fb_emu_arrive_and_wait(fb_emu_warp_bar[w]);
  const int r = fb_emu_slots[w][l ^ (unsigned)off];
  fb_emu_arrive_and_wait(fb_emu_warp_bar[w]);
  return r;
}
static void fb_emu_fiber() {
  fb_emu_body(fb_emu_body_arg);
  fb_emu_arrive_and_drop(fb_emu_warp_bar[fb_emu_current / 32]);
  fb_emu_arrive_and_drop(fb_emu_block_bar);
  fb_emu_done[fb_emu_current] = true;  // (and back to the scheduler: uc_link)
}
template <typename F> static void fb_emu_invoke(void* f) { (*(F*)f)(); }
// a launch's blocks one after another, each block's threads at once
template <typename K, typename... A> static void fb_emu_blocks(K kernel, unsigned blocks, dim3 threads, A... args) {
  const unsigned n = threads.x * threads.y;
  const size_t page = (size_t)sysconf(_SC_PAGESIZE);
  if (n > FB_EMU_MAX_THREADS) { fprintf(stderr, "fb_emu: %u threads a block\n", n); abort(); }
  // each fiber's stack above a guard page (an overflow faults), mapped for the launch
  char* stacks = (char*)mmap(nullptr, (size_t)n * FB_EMU_STACK, PROT_READ | PROT_WRITE,
                             MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (stacks == MAP_FAILED) { perror("fb_emu: mmap"); abort(); }
  for (unsigned t = 0; t < n; ++t) mprotect(stacks + (size_t)t * FB_EMU_STACK, page, PROT_NONE);
  auto body = [&] { kernel(args...); };
  fb_emu_body = &fb_emu_invoke<decltype(body)>;
  fb_emu_body_arg = &body;
  for (unsigned b = 0; b < blocks; ++b) {
    fb_emu_block_bar = {n, 0, 0};
    for (unsigned w = 0; w * 32 < n; ++w) fb_emu_warp_bar[w] = {n - w * 32 < 32 ? n - w * 32 : 32, 0, 0};
    for (unsigned t = 0; t < n; ++t) {
      getcontext(&fb_emu_ctx[t]);
      fb_emu_ctx[t].uc_stack.ss_sp = stacks + (size_t)t * FB_EMU_STACK + page;
      fb_emu_ctx[t].uc_stack.ss_size = FB_EMU_STACK - page;
      fb_emu_ctx[t].uc_link = &fb_emu_sched;
      makecontext(&fb_emu_ctx[t], fb_emu_fiber, 0);
      fb_emu_done[t] = false;
    }
    blockIdx.x = b;
    for (unsigned live = n; live;) {
      const unsigned long events = fb_emu_events;
      for (unsigned t = 0; t < n; ++t) {
        if (fb_emu_done[t]) continue;
        fb_emu_current = t; threadIdx.x = t % threads.x; threadIdx.y = t / threads.x;
        swapcontext(&fb_emu_sched, &fb_emu_ctx[t]);
        live -= fb_emu_done[t];
      }
      if (live && events == fb_emu_events) {
        fprintf(stderr, "fb_emu: block %u deadlocked: %u threads wait at barriers that no thread reaches\n", b, live);
        abort();
      }
    }
  }
  munmap(stacks, (size_t)n * FB_EMU_STACK);
}
#else
static inline void __syncthreads() {}
static inline int __shfl_xor_sync(unsigned, int v, int) { return v; }
#endif
#define __expf(x) expf(x)  /* (glibc declares these two without exporting them) */
#define __logf(x) logf(x)
static inline float __fdividef(float x, float y) { return x / y; }
static inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
static const char* fb_emu_kernel = "";  // the last kernel launched, by name
extern "C" __attribute__((visibility("default"))) const char* fb_emu_last_kernel(void) { return fb_emu_kernel; }
template <typename K, typename... A> static void fb_emu_launch(const char* name, K kernel, unsigned blocks, int threads,
                                                             int, cudaStream_t, A... args) {
  fb_emu_kernel = name;
  gridDim.x = blocks; blockDim.x = (unsigned)threads; blockDim.y = 1; threadIdx.y = 0;
#ifdef FB_EMU_THREADED
  fb_emu_blocks(kernel, blocks, dim3((unsigned)threads), args...);
#else
  for (unsigned b = 0; b < blocks; ++b)
    for (int t = 0; t < threads; ++t) { blockIdx.x = b; threadIdx.x = (unsigned)t; kernel(args...); }
#endif
}
// a 2-D block: run thread by thread (exact only for kernels whose threads never wait on each other), or threaded
template <typename K, typename... A> static void fb_emu_launch(const char* name, K kernel, unsigned blocks, dim3 threads,
                                                             int, cudaStream_t, A... args) {
  fb_emu_kernel = name;
  gridDim.x = blocks; blockDim = threads;
#ifdef FB_EMU_THREADED
  fb_emu_blocks(kernel, blocks, threads, args...);
#else
  for (unsigned b = 0; b < blocks; ++b)
    for (unsigned y = 0; y < threads.y; ++y)
      for (unsigned t = 0; t < threads.x; ++t) { blockIdx.x = b; threadIdx.x = t; threadIdx.y = y; kernel(args...); }
#endif
}
""".replace("FB_EMU_SMS", str(SMS)).replace("FB_EMU_BLOCKS_PER_SM", str(BLOCKS_PER_SM))

HALF = r"""#pragma once
// the GPU's 2-byte layout, so that fp16 tensors pass through the ABI as they are; conversions round to nearest even
struct __half { unsigned short x; };
static inline float __half2float(__half h) { _Float16 f; memcpy(&f, &h.x, 2); return (float)f; }
static inline __half __float2half_rn(float f) { const _Float16 g = (_Float16)f; __half h; memcpy(&h.x, &g, 2); return h; }
"""

BF16 = r"""#pragma once
struct __nv_bfloat16 { unsigned short x; };
static inline float __bfloat162float(__nv_bfloat16 h) {
  const unsigned u = (unsigned)h.x << 16; float f; memcpy(&f, &u, 4); return f;
}
static inline __nv_bfloat16 __float2bfloat16_rn(float f) {
  unsigned u; memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return __nv_bfloat16{(unsigned short)((u >> 16) | 0x40u)};  // NaN stays NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return __nv_bfloat16{(unsigned short)(u >> 16)};
}
"""

HEADERS = {"cuda_runtime.h": CUDA_RUNTIME, "cuda_fp16.h": HALF, "cuda_bf16.h": BF16,
           "cooperative_groups.h": "#pragma once\nnamespace cooperative_groups {}\n",
           "cuda_pipeline.h": "#pragma once\n"}  # cp.async: only the cluster layout uses it, never emulated

_LAUNCH = re.compile(r"(\w+)<<<([^;]*?)>>>\(([^;]*?)\);")


def emulated(src: str, wide_index: bool = False) -> str:
    """The CUDA source with its launches turned into calls of the emulator, which records the last kernel's name for
    `fb_emu_last_kernel()` (fp16 and bf16 in their 2-byte layouts, converted as on the GPU). `wide_index`: the
    64-bit index paths even for small tensors (those of more than 2^31 elements)."""
    if wide_index:
        assert "a.small = a.N < 0x7fffffffLL;" in src
        src = src.replace("a.small = a.N < 0x7fffffffLL;", "a.small = 0;")
    return _LAUNCH.sub(lambda m: f'fb_emu_launch("{m.group(1)}", {m.group(1)}, {m.group(2)}, {m.group(3)});', src)


# What every catalog source includes first, in its order: compiled once per build into a precompiled header that
# g++ takes with `-include` (a source's own #include lines then find their guards set), so each source's compile
# parses only the source itself (0.31 s of CPU against 0.73 s, on the CI's kind of machine)
PREFIX = "".join(f"#include {h}\n" for h in ('"fusebot.h"', "<cuda_runtime.h>", "<cuda_fp16.h>", "<cuda_bf16.h>",
                                                "<math.h>", "<stdio.h>", "<string.h>", "<cooperative_groups.h>",
                                                "<cuda_pipeline.h>"))


def _flags(threaded: bool) -> list[str]:
    return ["-O0", "-std=c++17", "-fPIC", "-w", *(["-DFB_EMU_THREADED"] if threaded else [])]


def _run(procs: list[tuple[str, subprocess.Popen]]) -> None:
    for name, p in procs:
        log, _ = p.communicate(timeout=300)
        if p.returncode != 0:
            raise RuntimeError(f"{name}: g++ failed:\n{log[-3000:]}")


def build(sources: dict[str, str], where: Path, wide_index: tuple[str, ...] = (),
          threaded: tuple[str, ...] = ()) -> dict[str, Path]:
    """One shared library per source (name -> path), compiled in one g++ run each, in parallel, after the prefix
    header of each mode in use; the sources named in `wide_index` take their 64-bit index paths, those named in
    `threaded` run a block's threads at once."""
    inc = where / "emu_include"
    inc.mkdir(parents=True, exist_ok=True)
    for name, text in HEADERS.items():
        (inc / name).write_text(text)
    includes = ["-I", str(inc), "-I", str(CSRC)]
    modes = {name: name in threaded for name in sources}
    prefix: dict[bool, Path] = {}
    pchs = []
    for mode in sorted(set(modes.values())):
        prefix[mode] = where / f"emu_prefix_{'threaded' if mode else 'plain'}" / "fb_emu.h"
        prefix[mode].parent.mkdir(exist_ok=True)
        prefix[mode].write_text(PREFIX)
        pchs.append((f"prefix header ({'threaded' if mode else 'plain'})", subprocess.Popen(
            ["g++", *_flags(mode), *includes, "-x", "c++-header", str(prefix[mode]), "-o", f"{prefix[mode]}.gch"],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)))
    _run(pchs)
    procs, out = [], {}
    for name, src in sources.items():
        (where / f"{name}.cpp").write_text(emulated(src, name in wide_index))
        out[name] = where / f"{name}.so"
        procs.append((name, subprocess.Popen(
            ["g++", *_flags(modes[name]), "-shared", *includes, "-include", str(prefix[modes[name]]),
             f"{name}.cpp", "-o", out[name].name], cwd=where, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
            text=True)))
    _run(procs)
    return out


def last_kernel(lib) -> str:
    """The name of the kernel the library's last fusebot_forward launched (a runner.harness.procs.abi.KernelLibrary)."""
    import ctypes

    fn = lib.lib.fb_emu_last_kernel
    fn.restype = ctypes.c_char_p
    return fn().decode()
