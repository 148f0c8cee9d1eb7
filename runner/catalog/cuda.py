"""CUDA-C templates (fp32, fp16, bf16; loads widened to fp32, fp32 accumulation).

Layouts (this module: the shared prelude, helpers and `flat`; cuda_rows.py: `rows` and `columns`;
cuda_multiblock.py: `split` and `cluster`):

- `flat`: an elementwise program; each thread handles U vectors of V consecutive elements per step, each through one
  aligned vector access (V=2 halves is a half2 load, V=4 floats a float4), all U loaded before any is computed;
  grid-stride over one full wave of blocks, or one pass of the grid;
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

from runner.catalog.cgen import (
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
    layout: str = "rows"  # flat | rows | columns | split | cluster
    vec: int = 4  # elements per vector access (1 = scalar)
    threads: int = 256  # threads per block
    group: int = 0  # rows: threads per row (32 = a warp, 0 = the whole block)
    col_width: int = 32  # columns: threads across the inner dim
    slices: int = 8  # columns: threads splitting the reduced dim; split: blocks per row; cluster: blocks per cluster
    mode: str = "online"  # online | twopass
    grid: str = "stride"  # flat: stride (one wave of resident blocks) | once (one pass: U vectors per thread)
    fast_math: bool = False
    unroll: int = 1  # flat: vectors per thread per step, all loaded before any is computed

    def label(self) -> str:
        base = f"cuda-{self.layout}-v{self.vec}-t{self.threads}"
        if self.layout == "rows":
            base += f"-g{self.group or self.threads}-{self.mode}"
        elif self.layout == "columns":
            base += f"-w{self.col_width}x{self.slices}-{self.mode}"
        elif self.layout == "split":
            base += f"-s{self.slices}-{self.mode}"
        elif self.layout == "cluster":
            base += f"-c{self.slices}-{self.mode}"
        else:
            base += f"-{self.grid}" + (f"-u{self.unroll}" if self.unroll != 1 else "")
        return base + ("-fast" if self.fast_math else "")


PRELUDE = r"""#include "fusebot.h"
#pragma nv_diag_suppress 177
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <math.h>
#include <stdio.h>
#include <cooperative_groups.h>
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

    def __init__(self, p: Program, vec_inputs: set[int]):
        self.p, self.vec = p, vec_inputs
        self.used: set[int] = set()  # vector inputs the code emitted since the last clear() reads

    def __call__(self, k: int) -> str:
        if k in self.vec:
            self.used.add(k)
            return f"fb_f(v{k}.v[j])"
        return f"fb_f(((const {_ctype(self.p.inputs[k].dtype)}*)a.in[{k}])[{index_code(self.p, k)}])"

    def vector_decls(self, base: str, V: int, row_base: str = "r0") -> str:
        """Vector loads at `base` (an input of the full shape) or at `row_base` (a row vector: it varies along the
        reduced dims only, e.g. a LayerNorm's weight, and is read at the same place for every row)."""
        out = []
        for k in sorted(self.vec & self.used):
            t = _ctype(self.p.inputs[k].dtype)
            at = row_base if self.p.access(k) == "rowvec" else base
            out.append(f"const FbVec<{t}, {V}> v{k} = *(const FbVec<{t}, {V}>*)((const {t}*)a.in[{k}] + {at});")
        return "\n        ".join(out)


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


def _align_check(p: Program, vec_inputs: set[int], out_t: str, V: int, extra: str) -> str:
    conds = [f"fb_aligned(a.in[{k}], {V} * (int)sizeof({_ctype(p.inputs[k].dtype)}))" for k in sorted(vec_inputs)]
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
    from runner.catalog import cuda_multiblock, cuda_rows  # (they build on this module's helpers)

    body = {"flat": _flat, "rows": cuda_rows.render_rows, "columns": cuda_rows.render_columns,
            "split": cuda_multiblock.render_split, "cluster": cuda_multiblock.render_cluster}.get(params.layout)
    if body is None:
        raise NotExpressible(f"layout {params.layout}")
    return "\n".join(head) + body(p, params, out_t)


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


# ---- flat --------------------------------------------------------------------------------------------------


class _FlatLoads:
    """Element loads of the flat kernels, by how each input is read: `vec` (V elements in registers v{k}[u], filled
    by the load pass), `scalar` (read once per thread into s{k}) or `general` (an index from the strides, per
    element)."""

    def __init__(self, p: Program, how: dict[int, str]):
        self.p, self.how = p, how

    def __call__(self, k: int) -> str:
        h = self.how[k]
        if h == "vec":
            return f"fb_f(v{k}[u].v[j])"
        if h == "scalar":
            return f"s{k}"
        return f"fb_f(fb_ld1((const {_ctype(self.p.inputs[k].dtype)}*)a.in[{k}] + fb_bidx(a, {k}, flat)))"


def _flat_kernel(p: Program, name: str, how: dict[int, str], V: int, T: int, U: int, out_t: str) -> str:
    """One flat kernel: per step a block covers T * U vectors of V elements; each thread loads its U vectors first,
    then computes and stores them."""
    used = p.used_inputs()
    tu = T * U
    hoist, decls, loads = [], [], []
    for k in used:
        t = _ctype(p.inputs[k].dtype)
        ptr = f"(const {t}*)a.in[{k}]"
        if how[k] == "scalar":
            hoist.append(f"const float s{k} = fb_f(fb_ld1({ptr}));")
        elif how[k] == "vec":
            at = f"q * {V}"
            decls.append(f"FbVec<{t}, {V}> v{k}[{U}];")
            loads.append(f"v{k}[u] = fb_ldv<{t}, {V}>({ptr} + {at});")
    em = Emitter(_FlatLoads(p, how))
    res = em(p.out)
    body = [f"const long long nv = a.N / {V};", f"const long long t0 = (long long)blockIdx.x * {tu};", *hoist]
    loop = list(decls)
    if loads:
        loop += ["#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{",
                 f"  const long long q = t + u * {T} + threadIdx.x;",
                 "  if (q < nv) {", *_indent("\n".join(loads), 4).split("\n"), "  }", "}"]
    compute = [f"const long long base = q * {V};", f"FbVec<{out_t}, {V}> ov;", "#pragma unroll",
               f"for (int j = 0; j < {V}; ++j) {{", "  const long long flat = base + j; (void)flat;",
               *("  " + x for x in em.lines), f"  ov.v[j] = fb_to<{out_t}>({res});", "}",
               f"*(FbVec<{out_t}, {V}>*)(({out_t}*)a.out + base) = ov;"]
    loop += ["#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{", f"  const long long q = t + u * {T} + threadIdx.x;",
             "  if (q < nv) {", *("    " + x for x in compute), "  }", "}"]
    body += [f"for (long long t = t0; t < nv; t += (long long)gridDim.x * {tu}) {{", *("  " + x for x in loop), "}"]
    if V > 1:
        body += ["if (blockIdx.x == 0) {  // the last N % V elements",
                 f"  for (long long flat = nv * {V} + threadIdx.x; flat < a.N; flat += blockDim.x) {{",
                 "    const long long o = flat, r = 0, i = 0; (void)o; (void)r; (void)i;",
                 *("    " + x for x in Emitter_tail(p).split("\n")), "  }", "}"]
    body = [x.rstrip() for x in body if x.strip()]
    code = "\n".join("  " + x for x in body)
    return f"\n__global__ void __launch_bounds__({T}) {name}(FbArgs a) {{\n{code}\n}}\n"


def _flat_how(p: Program) -> dict[int, str]:
    return {k: {"full": "vec", "scalar": "scalar"}.get(p.access(k), "general") for k in range(len(p.inputs))}


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
    how = _flat_how(p)
    kernels = [_flat_kernel(p, f"fb_flat_v{v}", how, v, T, U, out_t) for v in sorted({1, V})]
    launch = "if (a.N == 0) return 0;\n" + _flat_launch(p, how, V, T, U, params.grid, out_t)
    return "".join(kernels) + _forward(_indent(launch, 2))


def _flat_launch(p: Program, how: dict[int, str], V: int, T: int, U: int, grid: str, out_t: str) -> str:
    narrow = _launch("fb_flat_v1", 1, T, U, grid)
    if V == 1:
        return narrow
    vec_in = {k for k in p.used_inputs() if how[k] == "vec"}
    return _either(_align_check(p, vec_in, out_t, V, ""), _launch(f"fb_flat_v{V}", V, T, U, grid), narrow)


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
