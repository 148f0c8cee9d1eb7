"""CUDA template `grid`: each row held on chip across a group of S co-resident blocks of one cooperative grid, like
`cluster` but without a cluster's limits (at most 16 blocks, all in one GPC).

Each row is cut into S slices, one per block of its group; the slice is read into shared memory once and the output
written from it, so the row crosses memory once each way whatever the number of passes. A pass's partials meet in a
global workspace: each block publishes its own and waits on its row's counter for the other S - 1 (no grid-wide
barrier; the launch is cooperative, so all the blocks it waits for are resident).

Measured on the H100 (4096 x 393216): softmax 5.35 ms and log-softmax 5.37 with S = 16 and 8-byte vectors, against
5.53-5.56 and 5.39-5.96 on clusters of 16; larger groups (S = 24-64) were slower. LayerNorm's 16 rows of 16 MB on a
group of every SM (S = 132-396) took 0.55-0.59 ms against 0.33 for `split` (sixteen rounds of fill, barrier and
write, the weight and bias re-read for every row), so it is not proposed where only one row fits on chip at a time;
GroupNorm's 896 rows of 8 MB, three at a time on groups of 88 blocks (two per SM), took 7.2-7.35 ms against 7.9 for
every other layout (69% of the floor: a group's two barriers a row are not hidden by the other two groups). Tried
and dropped there: each pass re-reading its slice from L2 instead of holding it (9.7-15 ms), and refilling a thread's
positions as it writes them out (8.0 against 7.3 ms; the cluster layout keeps that).

chunks K > 1 (one buffer, whole vectors): the slice's fill in K commit groups of each thread's own positions and the
first pass taking part k as soon as it has landed, so the pass before a row's first barrier overlaps the slice's
arrival instead of following it: GroupNorm 6.33-6.44 ms online in 4 parts against 7.17-7.46 whole (two-pass in 4
parts 6.86).
"""

from __future__ import annotations

from runner.catalog.codegen.common import NotExpressible, plan_passes
from runner.catalog.codegen.cuda.common import Loads, align_check, ctype_of, forward, row_bases, value_decls, workspace_code
from runner.catalog.codegen.cuda.onchip import (
    PADDED_FILL,
    slice_fill,
    slice_output,
    slice_pass,
    slice_pointers,
    slice_reads,
    slice_sizes,
    slice_turn,
)
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.ir import Program

SUPPORT = r"""
// a partial another block wrote: read from L2 (ld.global.cg), never from this SM's L1
template <typename A> __device__ __forceinline__ A fb_ld_partial(const A* p) {
  static_assert(sizeof(A) % 4 == 0, "accumulators are made of 4-byte words");
  A r; const int* s = (const int*)p; int* d = (int*)&r;
#pragma unroll
  for (int k = 0; k < (int)(sizeof(A) / 4); ++k) d[k] = __ldcg(s + k);
  return r;
}
"""


def render_grid(p: Program, params: CudaParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("grid is for row programs")
    V, T, S, U = params.vec, params.threads, params.slices, params.unroll
    if U not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {U}")
    if S < 2:
        raise NotExpressible("grid needs at least two blocks per row")
    K = params.chunks
    if K > 1 and (params.buffers != 1 or V == 1 or K > 8):
        raise NotExpressible("chunks: one buffer, whole vectors, at most 8 parts")
    unroll = f"#pragma unroll {U}\n" if U > 1 else ""  # (U = 1: the compiler's own unrolling; a pragma of 1 stops it)
    plan = plan_passes(p, params.mode)
    cached = sorted(k for k in range(len(p.inputs)) if p.access(k) == "full")
    if not cached:
        raise NotExpressible("nothing to keep on chip")
    rowvec = sorted(k for k in range(len(p.inputs)) if p.access(k) == "rowvec")
    ctype = {k: ctype_of(p.inputs[k].dtype) for k in cached + rowvec}
    P = plan.passes

    def decls(loads: Loads, v: int) -> str:
        return slice_reads(loads, ctype, cached, v)

    ws_decl = workspace_code(' '.join(f'{x.kind} {x.name};' for x in plan.accs))
    kernels = []
    for v in sorted({1, V}):
        loads = Loads(p, set(cached) | set(rowvec))
        smem = slice_pointers(cached, ctype, v)
        parts = []
        k = K if v > 1 else 1
        # (the scalar kernel stays one element at a time: the clusters' 4-wide middle made the grid slower on the
        # H100, L1 norm over rows of 65535 7.40 against 6.59 ms, where the clusters gained 1-3%)
        for pno in range(1, P + 1):
            accs, feed = slice_pass(plan, loads, pno, lambda w, ld=loads: decls(ld, w), v, T, unroll,
                                    k if pno == 1 else 1)
            decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)
            publish = "\n      ".join(f"ws[row * {S} + slice].{x.name} = {x.name};" for x in accs)
            reduce = "\n    ".join(f"fb_block_reduce<{x.kind}, {T}>({x.name});" for x in accs)
            gather = "\n    ".join(
                f"{x.name}.init(); for (int q = threadIdx.x; q < {S}; q += {T}) "
                f"{x.name}.merge(fb_ld_partial(&ws[row * {S} + q].{x.name})); fb_block_reduce<{x.kind}, {T}>({x.name});"
                for x in accs)
            parts.append(f"""    {decl}
{feed}
    {reduce}
    if (threadIdx.x == 0) {{
      {publish}
      __threadfence();
      atomicAdd(&cnt[row * {P} + {pno - 1}], 1u);
      while (*(volatile unsigned*)&cnt[row * {P} + {pno - 1}] < {S}u) __nanosleep(64);
      __threadfence();
    }}
    __syncthreads();
    {gather}
    {value_decls(plan, pno)}""")
        out = slice_output(p, plan, loads, lambda w, ld=loads: decls(ld, w), v, T, unroll, out_t, "slice == 0")
        passes = "\n".join(parts)
        kernels.append(f"""
// one group of {S} blocks per row at a time; nbuf == 2: the group's next row streams into a second buffer meanwhile
__global__ void __launch_bounds__({T}) fb_grid_v{v}(FbArgs a, FbWs* ws, unsigned* cnt, long long chunk,
                                                   long long bufbytes, int nbuf) {{
  extern __shared__ __align__(16) unsigned char fb_smem[];
  const long long groups = gridDim.x / {S};
  const int slice = blockIdx.x % {S};
  const long long lo = slice * chunk, hi = lo + chunk < a.R ? lo + chunk : a.R;
  int buf = 0;
  if (blockIdx.x / {S} < a.O) {{ {slice_fill(p, ctype, cached, v, T, f"blockIdx.x / {S}", "0", k)} }}
  __pipeline_commit();
  for (long long row = blockIdx.x / {S}; row < a.O; row += groups) {{
    const long long o = row, i = 0; (void)i;
    {row_bases(p)}
    {smem}
    {slice_turn(p, ctype, cached, v, T, "row + groups") if k == 1 else "// the first pass waits for the slice part by part"}
{passes}
{out}
    __syncthreads();  // this block's slice buffer is refilled next
    if (nbuf == 2) {{
      buf ^= 1;
    }} else {{
      if (row + groups < a.O) {{ {slice_fill(p, ctype, cached, v, T, "row + groups", "0", k)} }}
      __pipeline_commit();
    }}
  }}
}}
""")
    ok = align_check(p, set(cached) | set(rowvec), out_t, V, f"a.R % {V} == 0")
    launch = slice_sizes("grid", ctype, cached, ok, V, S, params.buffers) + f"""
  void (*kern)(FbArgs, FbWs*, unsigned*, long long, long long, int) = wide ? fb_grid_v{V} : fb_grid_v1;
  cudaFuncSetAttribute(kern, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)smem);
  int per_sm = 0;
  if (cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, kern, {T}, (size_t)smem) != cudaSuccess) per_sm = 0;
  const long long resident = (long long)per_sm * fb_sms();
  if (resident < {S}) {{
    snprintf(fb_err, sizeof fb_err, "a row's {S} blocks cannot all be resident (%lld fit)", resident);
    return 4;
  }}
  const long long groups = a.O < resident / {S} ? a.O : resident / {S};
  const size_t ws_bytes = (size_t)a.O * {S} * sizeof(FbWs), need = ws_bytes + (size_t)a.O * {P} * sizeof(unsigned);
  char* base = (char*)fb_workspace(need, s);
  if (!base) {{ snprintf(fb_err, sizeof fb_err, "workspace allocation failed"); return 3; }}
  FbWs* ws = (FbWs*)base;
  unsigned* cnt = (unsigned*)(base + ws_bytes);
  cudaMemsetAsync(cnt, 0, (size_t)a.O * {P} * sizeof(unsigned), s);
  cudaLaunchConfig_t cfg = {{}};
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeCooperative;  // refused unless every block is resident: no block waits on one that never runs
  attr[0].val.cooperative = 1;
  cfg.gridDim = dim3((unsigned)(groups * {S}));
  cfg.blockDim = dim3({T});
  cfg.dynamicSmemBytes = (size_t)smem;
  cfg.stream = s;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  cudaLaunchKernelEx(&cfg, kern, a, ws, cnt, chunk, bufbytes, nbuf);"""
    return SUPPORT + PADDED_FILL + ws_decl + "".join(kernels) + forward(launch)
