"""CUDA-C templates (fp32, fp16, bf16; loads widened to fp32, fp32 accumulation).

Layouts (this module: the shared prelude, helpers and `flat`; cuda_rows.py: `rows` and `columns`;
cuda_multiblock.py: `split` and `cluster`):

- `flat`: an elementwise program; each thread handles V consecutive elements per step through one aligned vector
  access (V=2 halves is a half2 load, V=4 floats a float4), grid-stride or one pass of the grid;
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
    layout: str = "rows"  # flat | rows | columns | split
    vec: int = 4  # elements per vector access (1 = scalar)
    threads: int = 256  # threads per block
    group: int = 0  # rows: threads per row (32 = a warp, 0 = the whole block)
    col_width: int = 32  # columns: threads across the inner dim
    slices: int = 8  # columns: threads splitting the reduced dim; split: blocks per row; cluster: blocks per cluster
    mode: str = "online"  # online | twopass
    grid: str = "stride"  # flat: stride (a few waves of blocks per SM) | once (one vector per thread)
    fast_math: bool = False
    buffers: int = 2  # cluster: 2 = the next row streams into a second buffer where two fit; 1 = one (two blocks/SM)

    def label(self) -> str:
        base = f"cuda-{self.layout}-v{self.vec}-t{self.threads}"
        if self.layout == "rows":
            base += f"-g{self.group or self.threads}-{self.mode}"
        elif self.layout == "columns":
            base += f"-w{self.col_width}x{self.slices}-{self.mode}"
        elif self.layout == "split":
            base += f"-s{self.slices}-{self.mode}"
        elif self.layout == "cluster":
            base += f"-c{self.slices}-{self.mode}" + ("-b1" if self.buffers == 1 else "")
        else:
            base += f"-{self.grid}"
        return base + ("-fast" if self.fast_math else "")


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


# ---- flat ---------------------------------------------------------------------------------------------------------


def _flat(p: Program, params: CudaParams, out_t: str) -> str:
    if p.is_row:
        raise NotExpressible("flat is for elementwise programs")
    V, T = params.vec, params.threads
    vec_in = _vec_inputs(p, ("full",))
    kernels = []
    for v in sorted({1, V}):
        loads = _Loads(p, vec_in if v > 1 else set())
        loads.used.clear()
        em = Emitter(loads)
        res = em(p.out)
        lines = "\n          ".join(em.lines)
        decl = loads.vector_decls("base", v) if v > 1 else ""
        kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_flat_v{v}(FbArgs a) {{
  const long long nv = a.N / {v};
  for (long long q = blockIdx.x * (long long)blockDim.x + threadIdx.x; q < nv; q += (long long)gridDim.x * blockDim.x) {{
    const long long base = q * {v};
    {decl}
    FbVec<{out_t}, {v}> ov;
#pragma unroll
    for (int j = 0; j < {v}; ++j) {{
          const long long flat = base + j, o = flat, r = 0, i = 0; (void)o; (void)r; (void)i;
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});
    }}
    *(FbVec<{out_t}, {v}>*)(({out_t}*)a.out + base) = ov;
  }}
  if ({v} > 1 && blockIdx.x == 0) {{
    for (long long flat = nv * {v} + threadIdx.x; flat < a.N; flat += blockDim.x) {{
      const long long o = flat, r = 0, i = 0; (void)o; (void)r; (void)i;
      {Emitter_tail(p)}
    }}
  }}
}}
""")
    cap = "fb_sms() * 8" if params.grid == "stride" else "0x7fffffffLL"
    ok = _align_check(p, vec_in, out_t, V, "")
    launch = f"""  if (a.N == 0) return 0;
  const bool wide = {V} > 1 && ({ok});
  const long long nv = wide ? a.N / {V} : a.N;
  long long blocks = (nv + {T} - 1) / {T};
  if (blocks > (long long)({cap})) blocks = (long long)({cap});
  if (blocks < 1) blocks = 1;
  if (wide) fb_flat_v{V}<<<(unsigned)blocks, {T}, 0, s>>>(a);
  else fb_flat_v1<<<(unsigned)blocks, {T}, 0, s>>>(a);""" if V > 1 else f"""  if (a.N == 0) return 0;
  long long blocks = (a.N + {T} - 1) / {T};
  if (blocks > (long long)({cap})) blocks = (long long)({cap});
  fb_flat_v1<<<(unsigned)blocks, {T}, 0, s>>>(a);"""
    return "".join(kernels) + _forward(launch)


def Emitter_tail(p: Program) -> str:  # noqa: N802 - reads as the scalar twin of the vector body
    out_t = _ctype(p.out_dtype)
    em = Emitter(_Loads(p, set()))
    res = em(p.out)
    return "\n      ".join([*em.lines, f"(({out_t}*)a.out)[flat] = fb_to<{out_t}>({res});"])


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
