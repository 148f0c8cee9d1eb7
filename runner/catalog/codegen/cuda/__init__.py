"""CUDA-C templates (fp32, fp16, bf16; loads widened to fp32, fp32 accumulation).

Layouts (this module: the shared prelude, helpers and `flat`; cuda_rows.py: `rows` and `columns`;
cuda_multiblock.py: `split` and `cluster`):

- `flat`: an elementwise program; each thread handles U vectors of V consecutive elements per step, each through one
  aligned vector access (V=2 halves is a half2 load, V=4 floats a float4), all U loaded before any is computed;
  grid-stride over one full wave of blocks, or one pass of the grid;
- `bcast`: `flat` for inputs broadcast along leading or trailing dims (a per-row scale `a[:, None]`, a bias
  `b[None, :]`, a per-channel `c[:, None, None]`): the output seen as [A, B, C], each input's index stepped forward
  from per-thread counters (no division per element), per-row values loaded once per vector;
- `rows`: a row program whose reduced dims are innermost (I = 1): a warp (GROUP=32) or a whole block per row,
  vector loads along the row, warp-shuffle then shared-memory merges of the accumulators;
- `columns`: reduced dims in the middle (I > 1): CW threads across contiguous inner elements (coalesced), RS threads
  splitting the reduced dim, merged through shared memory.
- `split`: few long rows (I = 1): each row cut into S slices, one block per slice; slice partials go to a workspace
  and the next pass (or the output pass) merges them, so all SMs work even with 16 rows.
- `cluster`: rows that fit on chip across a thread-block cluster (sm_90, up to 16 blocks): each block keeps its slice
  of the row in shared memory, partials merge through distributed shared memory: one read and one write of the row,
  however many passes the program needs.
"""

from __future__ import annotations

from dataclasses import dataclass

from runner.catalog.codegen.common import (
    ACCUMULATORS,
    CTYPE_CUDA,
    MATH,
    AccRef,
    Emitter,
    NotExpressible,
    args_struct,
    general_index_fn,
    index_code,
    int_output,
    setup_code,
    signature,
)
from runner.catalog.ir import Program


@dataclass(frozen=True)
class CudaParams:
    layout: str = "rows"  # flat | bcast | rows | columns | strided | split | cluster | grid
    vec: int = 4  # elements per vector access (1 = scalar)
    threads: int = 256  # threads per block
    group: int = 0  # rows: threads per row (32 = a warp, 0 = the whole block)
    col_width: int = 32  # columns: threads across the inner dim
    slices: int = 8  # columns: threads splitting the reduced dim; split, grid: blocks per row; cluster: blocks per cluster;
    # strided: groups of the reduced dim's periods
    mode: str = "online"  # online | twopass
    grid: str = "stride"  # flat, bcast: stride (one wave of resident blocks) | once (one pass: U vectors per thread);
    # split with a per-element output: once = each row's partials merged by one small kernel, then the output pass
    # one tile of U vectors per thread per block over the row (stride: every block merges them, then walks its slice)
    fast_math: bool = False
    buffers: int = 2  # cluster, grid: 2 = the next row streams into a second buffer where two fit; 1 = one
    unroll: int = 1  # flat, bcast, split: vectors per thread per step, all loaded before any is computed;
    # columns, cluster: the reduction loops unrolled U times (loads of U steps in flight)
    interleave: bool = False  # split: a row's blocks take turns along it (block s reads tiles s, s + S, ...: all
    # of them read one window of memory at a time) instead of each walking its own contiguous chunk
    chunks: int = 1  # grid, cluster with one buffer and whole vectors: the slice's fill in K commit groups, the first
    # pass taking each part as it lands instead of waiting for the whole slice

    def label(self) -> str:
        base = f"cuda-{self.layout}-v{self.vec}-t{self.threads}"
        if self.layout == "rows":
            base += f"-g{self.group or self.threads}-{self.mode}"
        elif self.layout == "columns":
            base += f"-w{self.col_width}x{self.slices}-{self.mode}"
        elif self.layout == "strided":
            base += f"-g{self.slices}"
        elif self.layout == "split":
            base += f"-s{self.slices}-{self.mode}" + ("-il" if self.interleave else "") + ("-once" if self.grid == "once" else "")
        elif self.layout == "cluster":
            base += f"-c{self.slices}-{self.mode}" + ("-b1" if self.buffers == 1 else "")
            base += f"-k{self.chunks}" if self.chunks > 1 else ""
        elif self.layout == "grid":
            base += f"-s{self.slices}-{self.mode}" + ("-b1" if self.buffers == 1 else "")
            base += f"-k{self.chunks}" if self.chunks > 1 else ""
        else:
            base += f"-{self.grid}"
        return base + (f"-u{self.unroll}" if self.unroll != 1 else "") + ("-fast" if self.fast_math else "")


PRELUDE = r"""#include "fusebot.h"
#pragma nv_diag_suppress 177
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <cooperative_groups.h>
#include <cuda_pipeline.h>
namespace cg = cooperative_groups;
#define FB_HD static __device__ __forceinline__
#define FB_M __device__ __forceinline__
typedef float fb_acc;

__device__ __forceinline__ float fb_f(float x) { return x; }
__device__ __forceinline__ float fb_f(double x) { return (float)x; }
__device__ __forceinline__ float fb_f(__half x) { return __half2float(x); }
__device__ __forceinline__ float fb_f(__nv_bfloat16 x) { return __bfloat162float(x); }
__device__ __forceinline__ float fb_f(long long x) { return (float)x; }
__device__ __forceinline__ float fb_f(int x) { return (float)x; }
__device__ __forceinline__ float fb_f(bool x) { return x ? 1.0f : 0.0f; }
__device__ __forceinline__ float fb_f(unsigned char x) { return (float)x; }
__device__ __forceinline__ float fb_f(signed char x) { return (float)x; }
template <typename T> __device__ __forceinline__ T fb_to(float v) { return (T)v; }
template <> __device__ __forceinline__ __half fb_to<__half>(float v) { return __float2half_rn(v); }
template <> __device__ __forceinline__ __nv_bfloat16 fb_to<__nv_bfloat16>(float v) { return __float2bfloat16_rn(v); }
// an index (argmax/argmin) is stored as it is: through a float it would round above 2^24
template <typename T> __device__ __forceinline__ T fb_to(long long v) { return (T)v; }
template <typename T, int V> struct alignas(sizeof(T) * V) FbVec { T v[V]; };

template <typename A> __device__ __forceinline__ A fb_shfl_xor(const A& a, int off) {
  static_assert(sizeof(A) % 4 == 0, "accumulators are made of 4-byte words");
  A r; const int* s = (const int*)&a; int* d = (int*)&r;
#pragma unroll
  for (int k = 0; k < (int)(sizeof(A) / 4); ++k) d[k] = __shfl_xor_sync(0xffffffffu, s[k], off);
  return r;
}
template <typename A> __device__ __forceinline__ void fb_warp_reduce(A& acc) {
#pragma unroll
  for (int off = 16; off > 0; off >>= 1) { A o = fb_shfl_xor(acc, off); acc.merge(o); }
}
template <typename A, int NT> __device__ __forceinline__ void fb_block_reduce(A& acc) {
  __shared__ A sh[32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  fb_warp_reduce(acc);
  if (lane == 0) sh[warp] = acc;
  __syncthreads();
  if (warp == 0) {
    A t; t.init();
    if (lane < NT / 32) t = sh[lane];
    fb_warp_reduce(t);
    if (lane == 0) sh[0] = t;
  }
  __syncthreads();
  acc = sh[0];
  __syncthreads();
}
static int fb_sms() {
  static int n = 0;
  if (!n) { int dev = 0; cudaGetDevice(&dev); cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev); }
  return n > 0 ? n : 1;
}
static bool fb_aligned(const void* p, int bytes) { return ((unsigned long long)p % (unsigned long long)bytes) == 0; }
// a read-only load of V elements through the non-coherent path (ld.global.nc), as one access when it is 2-16 bytes
template <typename T, int V> __device__ __forceinline__ FbVec<T, V> fb_ldv(const T* p) {
  FbVec<T, V> r;
  constexpr int B = (int)sizeof(T) * V;
  if constexpr (B == 16) { const uint4 x = __ldg((const uint4*)p); memcpy(&r, &x, 16); }
  else if constexpr (B == 8) { const uint2 x = __ldg((const uint2*)p); memcpy(&r, &x, 8); }
  else if constexpr (B == 4) { const unsigned x = __ldg((const unsigned*)p); memcpy(&r, &x, 4); }
  else if constexpr (B == 2) { const unsigned short x = __ldg((const unsigned short*)p); memcpy(&r, &x, 2); }
  else if constexpr (B == 1) { const unsigned char x = __ldg((const unsigned char*)p); memcpy(&r, &x, 1); }
  else {
    static_assert(B % 16 == 0, "vector loads of 1, 2, 4, 8 or a multiple of 16 bytes");
#pragma unroll
    for (int c = 0; c < B / 16; ++c) { const uint4 x = __ldg((const uint4*)p + c); memcpy((char*)&r + 16 * c, &x, 16); }
  }
  return r;
}
template <typename T> __device__ __forceinline__ T fb_ld1(const T* p) { return fb_ldv<T, 1>(p).v[0]; }
// a store of V elements as one access of 2-16 bytes (several of 16 above that), in PTX: a vector written through the
// FbVec itself, or through memcpy into a uint4, was split by nvcc into one st.global.f32 per element (the H100's
// softmax on chip: 6.5 ms with float4 stores so split, against 4.7 for the same pipeline's st.global.v4)
template <typename T, int V> __device__ __forceinline__ void fb_stv(T* p, const FbVec<T, V>& r) {
  constexpr int B = (int)sizeof(T) * V;
#ifndef __CUDA_ARCH__
  memcpy(p, &r, B);  // the tests' emulation on the CPU (g++)
#else
  if constexpr (B % 16 == 0) {
    unsigned w[B / 4];
    memcpy(w, &r, B);
#pragma unroll
    for (int c = 0; c < B / 16; ++c)
      asm volatile("st.global.v4.b32 [%0], {%1, %2, %3, %4};" ::"l"((char*)p + 16 * c), "r"(w[4 * c]),
                   "r"(w[4 * c + 1]), "r"(w[4 * c + 2]), "r"(w[4 * c + 3]));
  } else if constexpr (B == 8) {
    unsigned w[2];
    memcpy(w, &r, 8);
    asm volatile("st.global.v2.b32 [%0], {%1, %2};" ::"l"(p), "r"(w[0]), "r"(w[1]));
  } else if constexpr (B == 4) {
    unsigned w;
    memcpy(&w, &r, 4);
    asm volatile("st.global.b32 [%0], %1;" ::"l"(p), "r"(w));
  } else if constexpr (B == 2) {
    unsigned short w;
    memcpy(&w, &r, 2);
    asm volatile("st.global.b16 [%0], %1;" ::"l"(p), "h"(w));
  } else {
    static_assert(B == 1, "vector stores of 1, 2, 4, 8 or a multiple of 16 bytes");
    memcpy(p, &r, 1);
  }
#endif
}
// blocks of `threads` that fill every SM once (what a grid-stride loop wants)
template <typename K> static long long fb_wave(K kernel, int threads) {
  int nb = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&nb, kernel, threads, 0) != cudaSuccess || nb < 1) {
    (void)cudaGetLastError();
    nb = 1;
  }
  return (long long)nb * fb_sms();
}
"""

FAST = "#define FB_FAST\n#define FB_FAST_EXP(x) __expf(x)\n#define FB_FAST_DIV(x, y) __fdividef(x, y)\n" \
       "#define FB_FAST_LOG(x) __logf(x)\n"


def _ctype(dtype: str) -> str:
    if dtype not in CTYPE_CUDA:
        raise NotExpressible(f"dtype {dtype}")
    return CTYPE_CUDA[dtype]


class _Loads:
    """Element loads: vector registers for inputs read V-wide, indexed loads for the rest."""

    def __init__(self, p: Program, vec_inputs: set[int], runs: bool = True):
        self.p, self.vec = p, vec_inputs
        # with vectors, a rowblock input is one value per vector (the host checks that its runs are whole vectors),
        # or, where it was captured with runs of one element (its dims all vary inside the row), a vector of its own;
        # `runs` False: the vectors go across columns, and a rowblock input is one value per reduced index
        self.blk = set(rowblock_inputs(p)) if vec_inputs else set()
        self.blk_vec = {k for k in self.blk if runs and p.block_len(k) == 1}
        self.used: set[int] = set()  # vector (and rowblock) inputs the code emitted since the last clear() reads

    def __call__(self, k: int) -> str:
        if k in self.vec:
            self.used.add(k)
            return f"fb_f(v{k}.v[j])"
        if k in self.blk:
            self.used.add(k)
            return f"fb_f(b{k}.v[j])" if k in self.blk_vec else f"fb_f(b{k})"
        return f"fb_f(((const {_ctype(self.p.inputs[k].dtype)}*)a.in[{k}])[{index_code(self.p, k)}])"

    def block_decls(self, r0: str, V: int) -> str:
        """The value of each rowblock input the code read for the vector at in-row position `r0` (rb{k}: its offset
        at the row's start, from row_bases), or its V values there where its runs are single elements."""
        out = []
        for k in sorted(self.blk & self.used):
            t = _ctype(self.p.inputs[k].dtype)
            out.append(f"const FbVec<{t}, {V}> b{k} = fb_ldv<{t}, {V}>((const {t}*)a.in[{k}] + rb{k} + {r0});"
                       if k in self.blk_vec else f"const {t} b{k} = ((const {t}*)a.in[{k}])[rb{k} + fb_rbq(a, {k}, {r0})];")
        return " ".join(out)

    def vector_decls(self, base: str, V: int, row_base: str = "r0") -> str:
        """Vector loads at `base` (an input of the full shape) or at `row_base` (a row vector: it varies along the
        reduced dims only, e.g. a LayerNorm's weight, and is read at the same place for every row)."""
        out = []
        for k in sorted(self.vec & self.used):
            t = _ctype(self.p.inputs[k].dtype)
            at = vector_at(self.p, k, base, row_base)
            out.append(f"const FbVec<{t}, {V}> v{k} = fb_ldv<{t}, {V}>((const {t}*)a.in[{k}] + {at});")
        if self.blk & self.used:
            out.append(self.block_decls(row_base, V))
        return "\n        ".join(out)


def vector_at(p: Program, k: int, base: str, row_base: str) -> str:
    """Where input k's vector for the output vector at flat `base` / in-row `row_base` starts."""
    kind = p.access(k)
    return {"rowvec": row_base, "rowper": f"fb_rper(a, {k}, {row_base})"}.get(kind, base)


UNIT_RUNS = """
// rowblock runs of one element are read V-wide from each row's start: V divides every outer stride, the base aligns
static bool fb_unit_runs(const FbArgs& a, int k, int V, int esize) {
  if (a.bL[k] != 1 || !fb_aligned(a.in[k], V * esize)) return false;
  for (int d = 0; d < a.a0; ++d) if (a.st[k][d] % V) return false;
  return true;
}
"""


def rowblock_inputs(p: Program) -> list[int]:
    return [k for k in range(len(p.inputs)) if p.access(k) == "rowblock"]


def row_bases(p: Program) -> str:
    """Per row (after `o` is known): each rowblock input's offset at the row's start."""
    return " ".join(f"const long long rb{k} = fb_obase(a, {k}, o); (void)rb{k};" for k in rowblock_inputs(p))


def pass_feed(plan, loads: _Loads, pno: int, indent: str) -> tuple[list, str]:
    """Pass `pno` of a row plan: its accumulators, and the loop body (lines joined at `indent`) that loads what they
    need and feeds them."""
    accs = [x for x in plan.accs if x.pass_no == pno]
    loads.used.clear()
    em = Emitter(loads)
    adds = [f"{x.name}.add({em(x.arg)}, r);" for x in accs]
    return accs, indent.join(em.lines + adds)


def _vec_inputs(p: Program, kinds: tuple[str, ...]) -> set[int]:
    return {k for k in range(len(p.inputs)) if p.access(k) in kinds}


def _align_check(p: Program, vec_inputs: set[int], out_t: str, V: int, extra: str, runs: bool = True) -> str:
    """The host's test for the V-wide kernel: aligned pointers, `extra`, each rowper input's period whole vectors,
    and (`runs`: vectors along the row) each rowblock input's runs made of whole vectors."""
    conds = [f"fb_aligned(a.in[{k}], {V} * (int)sizeof({_ctype(p.inputs[k].dtype)}))" for k in sorted(vec_inputs)]
    conds += [f"a.bL[{k}] % {V} == 0" for k in sorted(vec_inputs) if p.access(k) == "rowper"]  # no vector wraps
    for k in rowblock_inputs(p) if runs else []:
        if p.block_len(k) == 1:  # read V-wide from its offset at each row's start
            conds.append(f"fb_unit_runs(a, {k}, {V}, (int)sizeof({_ctype(p.inputs[k].dtype)}))")
        else:
            conds.append(f"a.bL[{k}] % {V} == 0")
    conds.append(f"fb_aligned(a.out, {V} * (int)sizeof({out_t}))")
    if extra:
        conds.append(extra)
    return " && ".join(conds)


def render(p: Program, params: CudaParams, abi_offset: int = 0) -> str:
    out_t = _ctype(p.out_dtype)
    for inp in p.inputs:
        _ctype(inp.dtype)
    if params.vec not in (1, 2, 4, 8) or params.threads % 32 or not 32 <= params.threads <= 1024:
        raise NotExpressible(f"vector width {params.vec} / {params.threads} threads")
    head = [f"// fusebot catalog: {params.label()}", f"// {signature(p)}", PRELUDE]
    if params.fast_math:
        head.append(FAST)
    head += [MATH, ACCUMULATORS, args_struct(p), general_index_fn().replace("FB_HD", "static __device__ __forceinline__"),
             setup_code(p, abi_offset)]
    if rowblock_inputs(p):
        head.append(UNIT_RUNS)
    from runner.catalog.codegen.cuda import grid as cuda_grid  # (they build on this module's helpers)
    from runner.catalog.codegen.cuda import multiblock as cuda_multiblock
    from runner.catalog.codegen.cuda import rows as cuda_rows

    body = {"flat": _flat, "bcast": _bcast, "rows": cuda_rows.render_rows, "columns": cuda_rows.render_columns,
            "strided": cuda_rows.render_strided,
            "split": cuda_multiblock.render_split, "cluster": cuda_multiblock.render_cluster,
            "grid": cuda_grid.render_grid}.get(params.layout)
    if body is None:
        raise NotExpressible(f"layout {params.layout}")
    return "\n".join(head) + body(p, params, out_t)


def workspace_code(fields: str) -> str:
    """A library's device workspace: `struct FbWs { fields }` and fb_workspace(bytes, stream), which grows one buffer
    on the caller's stream (never shrinks it) and returns 0, keeping nothing, when the allocation fails."""
    return f"""struct FbWs {{ {fields or 'int unused;'} }};
static void* fb_ws = 0;
static size_t fb_ws_bytes = 0;
static void* fb_workspace(size_t need, cudaStream_t s) {{
  if (need > fb_ws_bytes) {{
    if (fb_ws) cudaFreeAsync(fb_ws, s);
    fb_ws_bytes = 0;
    if (cudaMallocAsync(&fb_ws, need, s) != cudaSuccess) {{ fb_ws = 0; return 0; }}
    fb_ws_bytes = need;
  }}
  return fb_ws;
}}
"""


def _forward(launch: str) -> str:
    return f"""
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {{
  FbArgs a;
  if (fb_setup(in, n_in, out, n_out, &a)) return 1;
  cudaStream_t s = (cudaStream_t)stream;
{launch}
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {{ snprintf(fb_err, sizeof fb_err, "launch: %s", cudaGetErrorString(e)); return 2; }}
  return 0;
}}
"""


# ---- flat and bcast ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class BroadcastView:
    """An elementwise program's output seen as [A, B, C], three consecutive runs of its dims, where every input either
    varies along a whole run or is broadcast along all of it: its element index is dA * sa + dB * sb + dC from the
    output's digits (dA, dB, dC) and its own strides, so a thread steps its digits forward and never divides.

    `seg`: each F dim's run (0 = A, 1 = B, 2 = C), -1 for a dim of size 1 at capture; `present`: per input, whether
    it varies along A, B, C (an input the output does not read: none). Two runs leave A empty (of size 1)."""

    seg: tuple[int, ...]
    present: tuple[tuple[bool, bool, bool], ...]
    sizes: tuple[int, int, int]  # A, B, C at capture

    @property
    def three(self) -> bool:
        return 0 in self.seg


def broadcast_view(p: Program) -> BroadcastView | None:
    """The [A, B, C] view of an elementwise program with a broadcast input (a per-row `a[:, None]`, a bias
    `b[None, :]`, a per-channel `c[:, None, None]` of an NCHW tensor); None without one, or when more than three runs
    of dims read differently (those take the general index path)."""
    used = p.used_inputs()
    if p.is_row or not any(p.access(k) == "general" for k in used):
        return None
    runs: list[tuple[tuple[bool, ...], list[int]]] = []
    for d, f in enumerate(p.shape):
        if f == 1:
            continue
        mask = tuple(p.padded(k)[d] != 1 for k in used)
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(d)
        else:
            runs.append((mask, [d]))
    if not 2 <= len(runs) <= 3:
        return None
    first = 3 - len(runs)
    seg, sizes = [-1] * p.ndim, [1, 1, 1]
    for r, (_, dims) in enumerate(runs):
        for d in dims:
            seg[d] = first + r
            sizes[first + r] *= p.shape[d]
    present = [(False, False, False)] * len(p.inputs)
    for n, k in enumerate(used):
        present[k] = tuple([False] * first + [m[n] for m, _ in runs])  # type: ignore[assignment]
    return BroadcastView(tuple(seg), tuple(present), (sizes[0], sizes[1], sizes[2]))


class _FlatLoads:
    """Element loads of the flat kernels, by how each input is read: `vec` (V elements in registers v{k}[u], filled
    by the load pass), `row` (one value per vector in w{k}[u]: an input broadcast along the view's last run),
    `scalar` (read once per thread into s{k}) or `general` (an index from the strides, per element)."""

    def __init__(self, p: Program, how: dict[int, str]):
        self.p, self.how = p, how

    def __call__(self, k: int) -> str:
        h = self.how[k]
        if h == "vec":
            return f"fb_f(v{k}[u].v[j])"
        if h == "row":
            return f"fb_f(w{k}[u])"
        if h == "scalar":
            return f"s{k}"
        return f"fb_f(fb_ld1((const {_ctype(self.p.inputs[k].dtype)}*)a.in[{k}] + fb_bidx(a, {k}, flat)))"


def _bc_index(view: BroadcastView, k: int) -> str:
    pa, pb, pc = view.present[k]
    terms = ([f"dA * g.sa[{k}]"] if pa else []) + ([f"dB * g.sb[{k}]"] if pb else []) + (["dC"] if pc else [])
    return " + ".join(terms) or "0"


def _flat_kernel(p: Program, name: str, how: dict[int, str], V: int, T: int, U: int, out_t: str,
                 view: BroadcastView | None = None) -> str:
    """One flat kernel: per step a block covers T * U vectors of V elements; each thread loads its U vectors (and
    each vector's per-row values) first, then computes and stores them. `view`: a bcast kernel, whose broadcast
    inputs are indexed from the digits the thread steps forward (sizes and steps in FbBc g, set by the host)."""
    used = p.used_inputs()
    tu = T * U
    hoist, decls, loads = [], [], []
    for k in used:
        t = _ctype(p.inputs[k].dtype)
        ptr = f"(const {t}*)a.in[{k}]"
        if how[k] == "scalar":
            hoist.append(f"const float s{k} = fb_f(fb_ld1({ptr}));")
        elif how[k] == "vec":
            at = f"q * {V}" if p.access(k) == "full" else _bc_index(view, k)  # type: ignore[arg-type]
            decls.append(f"FbVec<{t}, {V}> v{k}[{U}];")
            loads.append(f"v{k}[u] = fb_ldv<{t}, {V}>({ptr} + {at});")
        elif how[k] == "row":
            decls.append(f"{t} w{k}[{U}];")
            loads.append(f"w{k}[u] = fb_ld1({ptr} + {_bc_index(view, k)});")  # type: ignore[arg-type]
    em = Emitter(_FlatLoads(p, how))
    res = em(p.out)
    body = [f"const long long nv = a.N / {V};", f"const long long t0 = (long long)blockIdx.x * {tu};", *hoist]
    step: list[str] = []
    if view is not None:
        body += ["long long dA = 0, dB = 0, dC = 0; (void)dA;",
                 f"fb_bc_at(g, (t0 + threadIdx.x) * {V}, a.small, dA, dB, dC);"]
        step = [f"if (u < {U} - 1) fb_bc_step(g, dA, dB, dC, g.a1, g.b1, g.c1);",
                "else fb_bc_step(g, dA, dB, dC, g.a2, g.b2, g.c2);"]
    loop = list(decls)
    if loads or step:
        loop += ["#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{",
                 f"  const long long q = t + u * {T} + threadIdx.x;",
                 "  if (q < nv) {", *_indent("\n".join(loads), 4).split("\n"), "  }", *_indent("\n".join(step), 2).split("\n"),
                 "}"]
    compute = [f"const long long base = q * {V};", f"FbVec<{out_t}, {V}> ov;", "#pragma unroll",
               f"for (int j = 0; j < {V}; ++j) {{", "  const long long flat = base + j; (void)flat;",
               *("  " + x for x in em.lines), f"  ov.v[j] = fb_to<{out_t}>({res});", "}",
               f"fb_stv<{out_t}, {V}>(({out_t}*)a.out + base, ov);"]
    loop += ["#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{", f"  const long long q = t + u * {T} + threadIdx.x;",
             "  if (q < nv) {", *("    " + x for x in compute), "  }", "}"]
    body += [f"for (long long t = t0; t < nv; t += (long long)gridDim.x * {tu}) {{", *("  " + x for x in loop), "}"]
    if V > 1 and view is None:  # (a bcast kernel is wide only when the rows are whole vectors: no tail)
        body += ["if (blockIdx.x == 0) {  // the last N % V elements",
                 f"  for (long long flat = nv * {V} + threadIdx.x; flat < a.N; flat += blockDim.x) {{",
                 "    const long long o = flat, r = 0, i = 0; (void)o; (void)r; (void)i;",
                 *("    " + x for x in Emitter_tail(p).split("\n")), "  }", "}"]
    body = [x.rstrip() for x in body if x.strip()]
    code = "\n".join("  " + x for x in body)
    sig = "FbArgs a" if view is None else "FbArgs a, FbBc g"
    return f"\n__global__ void __launch_bounds__({T}) {name}({sig}) {{\n{code}\n}}\n"


def _flat_how(p: Program, view: BroadcastView | None) -> dict[int, str]:
    how = {}
    for k in range(len(p.inputs)):
        acc = p.access(k)
        if acc in ("full", "scalar"):
            how[k] = "vec" if acc == "full" else "scalar"
        elif view is None:
            how[k] = "general"
        else:
            how[k] = "vec" if view.present[k][2] else "row"
    return how


def _indent(text: str, n: int) -> str:
    return "\n".join((" " * n + x) if x else x for x in text.split("\n"))


def _launch(kernel: str, V: int, T: int, U: int, grid: str, args: str = "a", prep: str = "") -> str:
    """Host code launching `kernel` over nv = a.N / V vectors, T * U per block: one pass of the grid, or (stride) at
    most one full wave of resident blocks, from the occupancy the compiled kernel reaches."""
    out = [f"long long blocks = (a.N / {V} + {T * U - 1}) / {T * U};"]
    if grid == "stride":
        out.append(f"{{ static const long long wave = fb_wave({kernel}, {T}); if (blocks > wave) blocks = wave; }}")
    out.append("if (blocks < 1) blocks = 1;")
    if prep:
        out.append(prep)
    out.append(f"{kernel}<<<(unsigned)blocks, {T}, 0, s>>>({args});")
    return "\n".join(out)


def _either(cond: str, then: str, other: str) -> str:
    return f"if ({cond}) {{\n{_indent(then, 2)}\n}} else {{\n{_indent(other, 2)}\n}}"


def _flat(p: Program, params: CudaParams, out_t: str) -> str:
    if p.is_row:
        raise NotExpressible("flat is for elementwise programs")
    if params.unroll not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {params.unroll}")
    V, T, U = params.vec, params.threads, params.unroll
    how = _flat_how(p, None)
    kernels = [_flat_kernel(p, f"fb_flat_v{v}", how, v, T, U, out_t) for v in sorted({1, V})]
    launch = "if (a.N == 0) return 0;\n" + _flat_launch(p, how, V, T, U, params.grid, out_t)
    return "".join(kernels) + _forward(_indent(launch, 2))


def _flat_launch(p: Program, how: dict[int, str], V: int, T: int, U: int, grid: str, out_t: str) -> str:
    narrow = _launch("fb_flat_v1", 1, T, U, grid)
    if V == 1:
        return narrow
    vec_in = {k for k in p.used_inputs() if how[k] == "vec"}
    return _either(_align_check(p, vec_in, out_t, V, ""), _launch(f"fb_flat_v{V}", V, T, U, grid), narrow)


def _bcast_support(p: Program, view: BroadcastView) -> str:
    """FbBc, the device helpers that find and step a thread's digits, and the host check that the run-time shapes
    read as the captured view (otherwise the general flat kernels run)."""
    n, nd = max(len(p.inputs), 1), max(p.ndim, 1)
    used = p.used_inputs()
    seg = ", ".join(str(x) for x in view.seg) or "-1"
    pres = ", ".join("{" + ", ".join("true" if x else "false" for x in view.present[k]) + "}"
                     for k in range(len(p.inputs))) or "{false, false, false}"
    if view.three:
        dev_at = """if (small) {
    const unsigned x = (unsigned)f, c = (unsigned)g.C, b = (unsigned)g.B, r = x / c, q = r / b;
    dC = x - r * c; dB = r - q * b; dA = q;
  } else {
    const long long r = f / g.C; dC = f - r * g.C; dB = r % g.B; dA = r / g.B;
  }"""
        dev_step = ("dC += sC; if (dC >= g.C) { dC -= g.C; ++dB; }\n  dB += sB; if (dB >= g.B) { dB -= g.B; ++dA; }\n"
                    "  dA += sA;")
        host_split = "C = n % g.C; n /= g.C; B = n % g.B; A = n / g.B;"
    else:  # A is empty: dA stays 0
        dev_at = """if (small) { const unsigned x = (unsigned)f, c = (unsigned)g.C, r = x / c; dC = x - r * c; dB = r; }
  else { const long long r = f / g.C; dC = f - r * g.C; dB = r; }"""
        dev_step = "dC += sC; if (dC >= g.C) { dC -= g.C; ++dB; }\n  dB += sB; (void)sA; (void)dA;"
        host_split = "C = n % g.C; B = n / g.C; A = 0;"
    checks = "\n".join(f"    if ((a.st[{k}][d] != 0) != pres[{k}][s]) return false;" for k in used)
    return f"""
struct FbBc {{
  long long A, B, C;                // the output as [A, B, C]
  long long sa[{n}], sb[{n}];        // each input's stride of dA and dB (0 where it is broadcast); dC's is 1 or 0
  long long a1, b1, c1;             // the digits of a step from one of a thread's vectors to the next
  long long a2, b2, c2;             // and from its last vector of a tile to its first of the next tile
}};
static bool fb_bc_view(const FbArgs& a, FbBc& g) {{
  static const int seg[{nd}] = {{{seg}}};
  static const bool pres[{n}][3] = {{{pres}}};
  long long S[3] = {{1, 1, 1}};
  for (int d = 0; d < {p.ndim}; ++d) {{
    if (a.F[d] == 1) continue;
    const int s = seg[d];
    if (s < 0) return false;
    S[s] *= a.F[d];
{checks}
  }}
  g.A = S[0]; g.B = S[1]; g.C = S[2];
  for (int k = 0; k < {len(p.inputs)}; ++k) {{
    g.sa[k] = pres[k][0] ? (pres[k][1] ? S[1] : 1) * (pres[k][2] ? S[2] : 1) : 0;
    g.sb[k] = pres[k][1] ? (pres[k][2] ? S[2] : 1) : 0;
  }}
  return true;
}}
static void fb_bc_split(const FbBc& g, long long n, long long& A, long long& B, long long& C) {{ {host_split} }}
static __device__ __forceinline__ void fb_bc_at(const FbBc& g, long long f, int small, long long& dA, long long& dB,
                                                long long& dC) {{
  {dev_at}
}}
static __device__ __forceinline__ void fb_bc_step(const FbBc& g, long long& dA, long long& dB, long long& dC,
                                                  long long sA, long long sB, long long sC) {{
  {dev_step}
}}
"""


def _bcast(p: Program, params: CudaParams, out_t: str) -> str:
    view = broadcast_view(p)
    if view is None:
        raise NotExpressible("bcast is for elementwise programs whose inputs broadcast along at most three runs of dims")
    if params.unroll not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {params.unroll}")
    V, T, U = params.vec, params.threads, params.unroll
    how, flat_how = _flat_how(p, view), _flat_how(p, None)
    kernels = [_bcast_support(p, view)]
    kernels += [_flat_kernel(p, f"fb_bc_v{v}", how, v, T, U, out_t, view) for v in sorted({1, V})]
    # the general path is the fall-back for shapes the view does not fit: one vector per thread per step (unrolled,
    # its per-element index divisions make the source several times slower to compile)
    kernels += [_flat_kernel(p, f"fb_flat_v{v}", flat_how, v, T, 1, out_t) for v in sorted({1, V})]

    def bc_launch(v: int) -> str:  # the steps between a thread's vectors depend on the grid: set here
        steps = (f"fb_bc_split(g, {T * v}LL, g.a1, g.b1, g.c1);\n"
                 f"fb_bc_split(g, blocks * {T * U * v}LL - {(U - 1) * T * v}LL, g.a2, g.b2, g.c2);")
        return _launch(f"fb_bc_v{v}", v, T, U, params.grid, "a, g", steps)

    bc = bc_launch(1)
    if V > 1:  # wide when every row is whole vectors (then so is every inner input's row) and the pointers align
        vec_in = {k for k in p.used_inputs() if how[k] == "vec"}
        bc = _either(_align_check(p, vec_in, out_t, V, f"g.C % {V} == 0"), bc_launch(V), bc)
    launch = "\n".join(["if (a.N == 0) return 0;", "FbBc g;",
                        _either("fb_bc_view(a, g)", bc, "// the run-time shapes broadcast otherwise: the general "
                                "index path\n" + _flat_launch(p, flat_how, V, T, 1, params.grid, out_t))])
    return "".join(kernels) + _forward(_indent(launch, 2))


def Emitter_tail(p: Program) -> str:  # noqa: N802 - reads as the scalar twin of the vector body
    out_t = _ctype(p.out_dtype)
    em = Emitter(_Loads(p, set()))
    res = em(p.out)
    return "\n".join([*em.lines, f"(({out_t}*)a.out)[flat] = fb_to<{out_t}>({res});"])


# ---- rows -----------------------------------------------------------------------------------------------------------


def _value_decls(plan, pno: int, ref=lambda n: n) -> str:
    return "\n    ".join(f"const {'long long' if v.is_int else 'float'} {v.name} = {v.code};"
                           for v in plan.values if v.pass_no == pno)


def _row_result(p: Program, plan, em: Emitter) -> str:
    if isinstance(plan.out, AccRef) and int_output(p):
        return plan.out.name
    if int_output(p):
        raise NotExpressible("integer arithmetic on a reduction index")
    return em(plan.out)
