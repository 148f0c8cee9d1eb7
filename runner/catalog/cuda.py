"""CUDA-C templates (fp32, fp16, bf16; loads widened to fp32, fp32 accumulation).

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
    full_output,
    general_index_fn,
    index_code,
    int_output,
    plan_passes,
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

    def __call__(self, k: int) -> str:
        if k in self.vec:
            return f"fb_f(v{k}.v[j])"
        return f"fb_f(((const {_ctype(self.p.inputs[k].dtype)}*)a.in[{k}])[{index_code(self.p, k)}])"

    def vector_decls(self, base: str, V: int) -> str:
        out = []
        for k in sorted(self.vec):
            t = _ctype(self.p.inputs[k].dtype)
            out.append(f"const FbVec<{t}, {V}> v{k} = *(const FbVec<{t}, {V}>*)((const {t}*)a.in[{k}] + {base});")
        return "\n        ".join(out)


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
    body = {"flat": _flat, "rows": _rows, "columns": _columns, "split": _split, "cluster": _cluster}.get(params.layout)
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


def _rows(p: Program, params: CudaParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("rows is for row programs")
    V, T = params.vec, params.threads
    G = params.group or T
    if G not in (32, T):
        raise NotExpressible("a row is handled by a warp or by the whole block")
    plan = plan_passes(p, params.mode)
    vec_in = _vec_inputs(p, ("full", "rowvec"))
    kernels = []
    for v in sorted({1, V}):
        loads = _Loads(p, vec_in if v > 1 else set())
        parts = []
        for pno in range(1, plan.passes + 1):
            accs = [x for x in plan.accs if x.pass_no == pno]
            em = Emitter(loads)
            adds = [f"{x.name}.add({em(x.arg)}, r);" for x in accs]
            body = "\n          ".join(em.lines + adds)
            red = "\n    ".join(f"fb_warp_reduce({x.name});" if G == 32 else f"fb_block_reduce<{x.kind}, {T}>({x.name});"
                                 for x in accs)
            decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)
            parts.append(f"""    {decl}
    for (long long r0 = (long long)lane * {v}; r0 < a.R; r0 += {G}LL * {v}) {{
        {loads.vector_decls("(o * a.R + r0)", v) if v > 1 else ""}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = (o * a.R + r) * a.I + i; (void)flat;
          {body}
        }}
    }}
    {red}
    {_value_decls(plan, pno)}""")
        em = Emitter(loads)
        assert plan.out is not None
        if full_output(p):
            res = em(plan.out)
            lines = "\n          ".join(em.lines)
            out = f"""    for (long long r0 = (long long)lane * {v}; r0 < a.R; r0 += {G}LL * {v}) {{
        {loads.vector_decls("(o * a.R + r0)", v) if v > 1 else ""}
        FbVec<{out_t}, {v}> ov;
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = (o * a.R + r) * a.I + i; (void)flat;
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});
        }}
        if ({v} == 1) (({out_t}*)a.out)[(o * a.R + r0) * a.I + i] = ov.v[0];
        else *(FbVec<{out_t}, {v}>*)(({out_t}*)a.out + o * a.R + r0) = ov;
    }}"""
        else:
            em = Emitter(_Loads(p, set()))
            res = _row_result(p, plan, em)
            lines = "\n      ".join(em.lines)
            out = f"""    if (lane == 0) {{
      const long long r = 0, flat = o * a.R * a.I + i; (void)r; (void)flat;
      {lines}
      (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});
    }}"""
        passes = "\n".join(parts)
        kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_rows_v{v}(FbArgs a) {{
  const int lane = threadIdx.x % {G};
  const long long rows = a.O * a.I;
  const int gpb = {T} / {G};
  for (long long row = (long long)blockIdx.x * gpb + threadIdx.x / {G}; row < rows; row += (long long)gridDim.x * gpb) {{
    const long long o = row / a.I, i = row % a.I;
{passes}
{out}
  }}
}}
""")
    rows_per_block = T // G
    ok = _align_check(p, vec_in, out_t, V, f"a.I == 1 && a.R % {V} == 0")
    launch = f"""  const long long rows = a.O * a.I;
  if (rows == 0) return 0;
  long long blocks = (rows + {rows_per_block} - 1) / {rows_per_block};
  if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;
  const bool wide = {V} > 1 && ({ok});
  if (wide) fb_rows_v{V}<<<(unsigned)blocks, {T}, 0, s>>>(a);
  else fb_rows_v1<<<(unsigned)blocks, {T}, 0, s>>>(a);"""
    return "".join(kernels) + _forward(launch)


# ---- columns ---------------------------------------------------------------------------------------------------


def _columns(p: Program, params: CudaParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("columns is for row programs")
    CW, RS = params.col_width, params.slices
    T = CW * RS
    if T > 1024 or T % 32:
        raise NotExpressible(f"{CW}x{RS} threads")
    plan = plan_passes(p, params.mode)
    loads = _Loads(p, set())
    parts = []
    for pno in range(1, plan.passes + 1):
        accs = [x for x in plan.accs if x.pass_no == pno]
        em = Emitter(loads)
        adds = [f"{x.name}.add({em(x.arg)}, r);" for x in accs]
        body = "\n        ".join(em.lines + adds)
        decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)
        merge = ""
        if RS > 1:
            merge = "\n    ".join(
                f"""{{ __shared__ {x.kind} sh[{RS}][{CW}];
      sh[threadIdx.y][threadIdx.x] = {x.name};
      __syncthreads();
      if (threadIdx.y == 0) {{
        for (int q = 1; q < {RS}; ++q) {x.name}.merge(sh[q][threadIdx.x]);
        sh[0][threadIdx.x] = {x.name};
      }}
      __syncthreads();
      {x.name} = sh[0][threadIdx.x];
      __syncthreads(); }}""" for x in accs)
        parts.append(f"""    {decl}
    if (ok) for (long long r = threadIdx.y; r < a.R; r += {RS}) {{
        const long long flat = (o * a.R + r) * a.I + i; (void)flat;
        {body}
    }}
    {merge}
    {_value_decls(plan, pno)}""")
    em = Emitter(loads)
    assert plan.out is not None
    if full_output(p):
        res = em(plan.out)
        lines = "\n        ".join(em.lines)
        out = f"""    if (ok) for (long long r = threadIdx.y; r < a.R; r += {RS}) {{
        const long long flat = (o * a.R + r) * a.I + i;
        {lines}
        (({out_t}*)a.out)[flat] = fb_to<{out_t}>({res});
    }}"""
    else:
        res = _row_result(p, plan, em)
        lines = "\n      ".join(em.lines)
        out = f"""    if (ok && threadIdx.y == 0) {{
      const long long r = 0, flat = o * a.R * a.I + i; (void)r; (void)flat;
      {lines}
      (({out_t}*)a.out)[o * a.I + i] = fb_to<{out_t}>({res});
    }}"""
    passes = "\n".join(parts)
    kernel = f"""
__global__ void __launch_bounds__({T}) fb_cols(FbArgs a) {{
  const long long tiles = (a.I + {CW} - 1) / {CW};
  for (long long tile = blockIdx.x; tile < a.O * tiles; tile += gridDim.x) {{
    const long long o = tile / tiles, i = (tile % tiles) * {CW} + threadIdx.x;
    const bool ok = i < a.I;
{passes}
{out}
  }}
}}
"""
    launch = f"""  const long long tiles = a.O * ((a.I + {CW} - 1) / {CW});
  if (tiles == 0) return 0;
  long long blocks = tiles < 0x7fffffffLL ? tiles : 0x7fffffffLL;
  fb_cols<<<(unsigned)blocks, dim3({CW}, {RS}), 0, s>>>(a);"""
    return kernel + _forward(launch)


# ---- split: several blocks per row ------------------------------------------------------------------------------


def _split(p: Program, params: CudaParams, out_t: str) -> str:
    """Pass k: grid (rows x S) blocks each merge their slice into ws[pass][row][slice]; the next kernel first merges
    the S partials of every earlier accumulator of its row (cheap: S values), then does its own slice."""
    if not p.is_row:
        raise NotExpressible("split is for row programs")
    V, T, S = params.vec, params.threads, params.slices
    plan = plan_passes(p, params.mode)
    vec_in = _vec_inputs(p, ("full", "rowvec"))
    accs = plan.accs
    ws_decl = f"""static void* fb_ws = 0;
static size_t fb_ws_bytes = 0;
struct FbWs {{ {' '.join(f'{x.kind} {x.name};' for x in accs) or 'int unused;'} }};
static FbWs* fb_workspace(long long rows, cudaStream_t s) {{
  size_t need = (size_t)rows * {S} * sizeof(FbWs);
  if (need > fb_ws_bytes) {{
    if (fb_ws) cudaFreeAsync(fb_ws, s);
    if (cudaMallocAsync(&fb_ws, need, s) != cudaSuccess) return 0;
    fb_ws_bytes = need;
  }}
  return (FbWs*)fb_ws;
}}
"""

    def gather(upto: int) -> str:
        """Merge the S partials of accumulators from passes < upto, then compute their values."""
        out = []
        for x in accs:
            if x.pass_no < upto:
                out.append(f"{x.kind} {x.name}; {x.name}.init(); "
                           f"for (int q = 0; q < {S}; ++q) {x.name}.merge(ws[row * {S} + q].{x.name});")
        for pno in range(1, upto):
            out.append(_value_decls(plan, pno))
        return "\n    ".join(out)

    kernels = []
    for v in sorted({1, V}):
        loads = _Loads(p, vec_in if v > 1 else set())
        for pno in range(1, plan.passes + 2):
            mine = [x for x in accs if x.pass_no == pno]
            em = Emitter(loads)
            last = pno == plan.passes + 1
            if not last:
                adds = [f"{x.name}.add({em(x.arg)}, r);" for x in mine]
                body = "\n          ".join(em.lines + adds)
                decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in mine)
                red = "\n    ".join(f"fb_block_reduce<{x.kind}, {T}>({x.name});" for x in mine)
                store = "\n      ".join(f"ws[row * {S} + slice].{x.name} = {x.name};" for x in mine)
                tail = f"""    {red}
    if (threadIdx.x == 0) {{
      {store}
    }}"""
            elif full_output(p):
                assert plan.out is not None
                res = em(plan.out)
                body = "\n          ".join(em.lines) + f"\n          ov.v[j] = fb_to<{out_t}>({res});"
                decl = ""
                tail = ""
            else:
                continue  # a per-row output is written by the finishing kernel below
            store_out = ""
            if last:
                store_out = f"""
        if ({v} == 1) (({out_t}*)a.out)[o * a.R + r0] = ov.v[0];
        else *(FbVec<{out_t}, {v}>*)(({out_t}*)a.out + o * a.R + r0) = ov;"""
            kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_split_p{pno}_v{v}(FbArgs a, FbWs* ws) {{
  const long long row = blockIdx.x / {S}, o = row, i = 0;
  const int slice = blockIdx.x % {S};
  const long long chunk = ((a.R + {S} - 1) / {S} + {v} - 1) / {v} * {v};
  const long long lo = slice * chunk, hi = lo + chunk < a.R ? lo + chunk : a.R;
  {gather(pno)}
  {decl}
  for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {{
        {loads.vector_decls("(o * a.R + r0)", v) if v > 1 else ""}
        {f"FbVec<{out_t}, {v}> ov;" if last else ""}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {body}
        }}{store_out}
  }}
{tail}
}}
""")
    if not full_output(p):
        em = Emitter(_Loads(p, set()))
        assert plan.out is not None
        res = _row_result(p, plan, em)
        lines = "\n    ".join(em.lines)
        kernels.append(f"""
__global__ void fb_split_finish(FbArgs a, FbWs* ws) {{
  const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x, o = row, i = 0;
  if (row >= a.O) return;
  const long long r = 0, flat = o * a.R; (void)r; (void)flat;
  {gather(plan.passes + 1)}
  {lines}
  (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});
}}
""")
    ok = _align_check(p, vec_in, out_t, V, f"a.R % {V} == 0")
    steps = []
    for pno in range(1, plan.passes + 1):
        steps.append(f"    if (wide) fb_split_p{pno}_v{V}<<<grid, {T}, 0, s>>>(a, ws); "
                     f"else fb_split_p{pno}_v1<<<grid, {T}, 0, s>>>(a, ws);")
    if full_output(p):
        last = plan.passes + 1
        steps.append(f"    if (wide) fb_split_p{last}_v{V}<<<grid, {T}, 0, s>>>(a, ws); "
                     f"else fb_split_p{last}_v1<<<grid, {T}, 0, s>>>(a, ws);")
    else:
        steps.append("    fb_split_finish<<<(unsigned)((a.O + 127) / 128), 128, 0, s>>>(a, ws);")
    launch = f"""  if (a.I != 1) {{ snprintf(fb_err, sizeof fb_err, "split needs the reduced dims innermost"); return 1; }}
  if (a.O == 0) return 0;
  FbWs* ws = fb_workspace(a.O, s);
  if (!ws) {{ snprintf(fb_err, sizeof fb_err, "workspace allocation failed"); return 3; }}
  const unsigned grid = (unsigned)(a.O * {S});
  const bool wide = {V} > 1 && ({ok});
  {{
{chr(10).join(steps)}
  }}"""
    return ws_decl + "".join(kernels) + _forward(launch)


# ---- cluster: a row held on chip across a thread-block cluster --------------------------------------------------


def _cluster(p: Program, params: CudaParams, out_t: str) -> str:
    """Each row is cut into C slices held in the shared memory of the C blocks of one cluster (sm_90): the row is
    read from memory once and written once whatever the number of passes; each pass merges the blocks' partials
    through distributed shared memory. C = 1 is a row cached in one block's shared memory."""
    if not p.is_row:
        raise NotExpressible("cluster is for row programs")
    V, T, C = params.vec, params.threads, params.slices
    if C not in (1, 2, 4, 8, 16):
        raise NotExpressible(f"cluster of {C} blocks")
    plan = plan_passes(p, params.mode)
    cached = sorted(_vec_inputs(p, ("full",)))
    if not cached:
        raise NotExpressible("nothing to keep on chip")
    ctype = {k: _ctype(p.inputs[k].dtype) for k in cached}

    def decls(v: int) -> str:
        out = []
        for k in cached:
            out.append(f"const FbVec<{ctype[k]}, {v}> v{k} = *(const FbVec<{ctype[k]}, {v}>*)(s{k} + (r0 - lo));")
        return "\n        ".join(out)

    slots = "\n  ".join(f"__shared__ {x.kind} part_{x.name};" for x in plan.accs)
    kernels = []
    for v in sorted({1, V}):
        loads = _Loads(p, set(cached))
        smem = []
        off = "0"
        for k in cached:
            smem.append(f"{ctype[k]}* s{k} = ({ctype[k]}*)(fb_smem + {off});")
            off = f"{off} + ((chunk * (long long)sizeof({ctype[k]}) + 15) / 16) * 16"
        fill = "\n        ".join(
            f"*(FbVec<{ctype[k]}, {v}>*)(s{k} + (r0 - lo)) = "
            f"*(const FbVec<{ctype[k]}, {v}>*)((const {ctype[k]}*)a.in[{k}] + o * a.R + r0);" for k in cached)
        parts = []
        for pno in range(1, plan.passes + 1):
            accs = [x for x in plan.accs if x.pass_no == pno]
            em = Emitter(loads)
            adds = [f"{x.name}.add({em(x.arg)}, r);" for x in accs]
            body = "\n          ".join(em.lines + adds)
            decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)
            merge = "\n    ".join(
                f"""fb_block_reduce<{x.kind}, {T}>({x.name});
    if (threadIdx.x == 0) part_{x.name} = {x.name};""" for x in accs)
            gather = "\n    ".join(
                f"""{{ {x.kind} t; t.init();
      for (int q = 0; q < {C}; ++q) t.merge(*cl.map_shared_rank(&part_{x.name}, q));
      {x.name} = t; }}""" for x in accs)
            parts.append(f"""    {decl}
    for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {{
        {decls(v)}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {body}
        }}
    }}
    {merge}
    cl.sync();
    {gather}
    {_value_decls(plan, pno)}""")
        em = Emitter(loads)
        assert plan.out is not None
        if full_output(p):
            res = em(plan.out)
            lines = "\n          ".join(em.lines)
            out = f"""    for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {{
        {decls(v)}
        FbVec<{out_t}, {v}> ov;
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});
        }}
        *(FbVec<{out_t}, {v}>*)(({out_t}*)a.out + o * a.R + r0) = ov;
    }}"""
        else:
            em = Emitter(_Loads(p, set()))
            res = _row_result(p, plan, em)
            lines = "\n      ".join(em.lines)
            out = f"""    if (rank == 0 && threadIdx.x == 0) {{
      const long long r = 0, flat = o * a.R; (void)r; (void)flat;
      {lines}
      (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});
    }}"""
        passes = "\n".join(parts)
        kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_cluster_v{v}(FbArgs a, long long chunk) {{
  cg::cluster_group cl = cg::this_cluster();
  const int rank = (int)cl.block_rank();
  extern __shared__ __align__(16) unsigned char fb_smem[];
  {slots}
  {chr(10).join("  " + x for x in smem)}
  const long long clusters = gridDim.x / {C};
  for (long long row = blockIdx.x / {C}; row < a.O; row += clusters) {{
    const long long o = row, i = 0; (void)i;
    const long long lo = rank * chunk, hi = lo + chunk < a.R ? lo + chunk : a.R;
    for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {{
        {fill}
    }}
    __syncthreads();
{passes}
{out}
    cl.sync();  // the partial slots and slices are reused by the next row
  }}
}}
""")
    sizes = " + ".join(f"((chunk * (long long)sizeof({ctype[k]}) + 15) / 16) * 16" for k in cached)
    ok = _align_check(p, set(cached), out_t, V, f"a.R % {V} == 0")
    launch = f"""  if (a.I != 1) {{ snprintf(fb_err, sizeof fb_err, "cluster needs the reduced dims innermost"); return 1; }}
  if (a.O == 0) return 0;
  const bool wide = {V} > 1 && ({ok});
  const int v = wide ? {V} : 1;
  const long long chunk = ((a.R + {C} - 1) / {C} + v - 1) / v * v;
  const long long smem = {sizes};
  if (smem > 227 * 1024) {{
    snprintf(fb_err, sizeof fb_err, "a slice of %lld elements needs %lld bytes of shared memory", chunk, smem);
    return 4;
  }}
  void (*kern)(FbArgs, long long) = wide ? fb_cluster_v{V} : fb_cluster_v1;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  if ({C} > 8) cudaFuncSetAttribute(kern, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaLaunchConfig_t cfg = {{}};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = {C};
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  cfg.blockDim = dim3({T});
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  int active = 0;
  cfg.gridDim = dim3({C});
  if (cudaOccupancyMaxActiveClusters(&active, kern, &cfg) != cudaSuccess || active < 1) active = 1;
  long long clusters = a.O < (long long)active ? a.O : (long long)active;
  cfg.gridDim = dim3((unsigned)(clusters * {C}));
  cudaLaunchKernelEx(&cfg, kern, a, chunk);"""
    return "".join(kernels) + _forward(launch)
