"""CUDA template `cluster`: rows that fit on chip across a thread-block cluster (sm_90, up to 16 blocks): each
block keeps its slice of the row in shared memory, partials merge through distributed shared memory: one read and
one write of the row, however many passes the program needs."""

from __future__ import annotations

from runner.catalog.codegen.common import NotExpressible, full_output, plan_passes
from runner.catalog.codegen.cuda.common import Loads, align_check, ctype_of, forward, row_bases, value_decls, vec_inputs
from runner.catalog.codegen.cuda.onchip import (
    PADDED_FILL,
    mid_bounds,
    mid_flag,
    mid_ok,
    slice_copy,
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


def render_cluster(p: Program, params: CudaParams, out_t: str) -> str:
    """Each row is cut into C slices held in the shared memory of the C blocks of one cluster (sm_90): the row is
    read from memory once and written once whatever the number of passes; each pass merges the blocks' partials
    through distributed shared memory. C = 1 is a row cached in one block's shared memory."""
    if not p.is_row:
        raise NotExpressible("cluster is for row programs")
    V, T, C, U = params.vec, params.threads, params.slices, params.unroll
    if U not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {U}")
    unroll = f"#pragma unroll {U}\n" if U > 1 else ""  # (U = 1: the compiler's own unrolling; a pragma of 1 stops it)
    if C not in (1, 2, 4, 8, 16):
        raise NotExpressible(f"cluster of {C} blocks")
    plan = plan_passes(p, params.mode)
    cached = sorted(vec_inputs(p, ("full",)))
    if not cached:
        raise NotExpressible("nothing to keep on chip")
    ctype = {k: ctype_of(p.inputs[k].dtype) for k in cached}
    K = params.chunks
    if K > 1 and (params.buffers != 1 or V == 1 or K > 8 or not full_output(p)):
        raise NotExpressible("chunks: one buffer refilled as the output is written, whole vectors, at most 8 parts")

    def decls(v: int) -> str:
        return slice_reads(loads, ctype, cached, v)

    # partial slots alternate between rows (par): a block writes row r + 2's slot only after every block of its
    # cluster passed row r + 1's first cluster barrier, so after they read row r's; no barrier closes a row
    slots = "\n  ".join(f"__shared__ {x.kind} part_{x.name}[2], tot_{x.name};" for x in plan.accs)
    kernels = []
    for v in sorted({1, V}):
        loads = Loads(p, set(cached))
        smem = slice_pointers(cached, ctype, v)
        parts = []
        k = K if v > 1 else 1
        mid = v == 1 and mid_ok(p, ctype, cached, out_t)
        for pno in range(1, plan.passes + 1):
            accs, feed = slice_pass(plan, loads, pno, decls, v, T, unroll, k if pno == 1 else 1, mid)
            decl = " ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)
            merge = "\n    ".join(
                f"""fb_block_reduce<{x.kind}, {T}>({x.name});
    if (threadIdx.x == 0) part_{x.name}[par] = {x.name};""" for x in accs)
            # lanes 0..C-1 of warp 0 each fetch one block's partial over DSMEM at once, merged by shuffles (every
            # thread fetching all C in turn cost C remote round trips per thread: 1024 threads ran at 26% of floor)
            gather = "\n    ".join(
                f"""if (threadIdx.x < 32) {{
      {x.kind} t; t.init();
      if (threadIdx.x < {C}) t = *cl.map_shared_rank(&part_{x.name}[par], (int)threadIdx.x);
      fb_warp_reduce(t);
      if (threadIdx.x == 0) tot_{x.name} = t;
    }}
    __syncthreads();
    {x.name} = tot_{x.name};""" for x in accs)
            parts.append(f"""    {decl}
{feed}
    {merge}
    cl.sync();
    {gather}
    {value_decls(plan, pno)}""")
        # one buffer and a full output: each thread refills the positions it has just written out from (its own),
        # so the next row streams in while this one streams out (H100, against refilling after the block's barrier:
        # softmax on clusters of 16 5.12 against 5.43 ms, of 8 5.18 against 6.09; InstanceNorm on 16 5.35 against
        # 5.49. The grid layout's groups did not gain: GroupNorm 8.0 against 7.3, softmax 5.54 against 5.35)
        fused = full_output(p) and v > 1  # (the scalar kernel's fill is by 16-byte pieces: no owned positions)
        refill = (f"if (nbuf == 1 && row + clusters < a.O) {{ "
                  f"{slice_copy(p, ctype, cached, v, 'row + clusters', '0')} }}") if fused else ""
        out = slice_output(p, plan, loads, decls, v, T, unroll, out_t, "rank == 0", refill, k, mid)
        passes = "\n".join(parts)
        kernels.append(f"""
// nbuf == 2: the next row's slice streams into the other buffer while this row's passes and output run.
__global__ void __launch_bounds__({T}) fb_cluster_v{v}(FbArgs a, long long chunk, long long bufbytes, int nbuf) {{
  cg::cluster_group cl = cg::this_cluster();
  const int rank = (int)cl.block_rank();
  extern __shared__ __align__(16) unsigned char fb_smem[];
  {slots}
  const long long clusters = gridDim.x / {C};
  const long long lo = rank * chunk, hi = lo + chunk < a.R ? lo + chunk : a.R;
  {mid_flag(cached) if mid else ""}
  int buf = 0, par = 0;
  if (blockIdx.x / {C} < a.O) {{ {slice_fill(p, ctype, cached, v, T, "blockIdx.x / " + str(C), "0", k)} }}
  __pipeline_commit();
  for (long long row = blockIdx.x / {C}; row < a.O; row += clusters) {{
    const long long o = row, i = 0; (void)i;
    {row_bases(p)}
    {smem}
    {mid_bounds(cached) if mid else ""}
    {slice_turn(p, ctype, cached, v, T, "row + clusters") if k == 1 else "// the first pass waits for the slice part by part"}
{passes}
{out}
    __syncthreads();  // before the next row (and its slice buffer's refill below, where the output did not refill it)
    par ^= 1;
    if (nbuf == 2) {{
      buf ^= 1;
    }} else {{
      {"" if fused else f"if (row + clusters < a.O) {{ {slice_fill(p, ctype, cached, v, T, 'row + clusters', '0')} }}"}
      __pipeline_commit();
    }}
  }}
  cl.sync();  // no block leaves while another may still read its partial slots
}}
""")
    ok = align_check(p, set(cached), out_t, V, f"a.R % {V} == 0")
    launch = slice_sizes("cluster", ctype, cached, ok, V, C, params.buffers) + f"""
  void (*kern)(FbArgs, long long, long long, int) = wide ? fb_cluster_v{V} : fb_cluster_v1;
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
  cudaLaunchKernelEx(&cfg, kern, a, chunk, bufbytes, nbuf);"""
    return PADDED_FILL + "".join(kernels) + forward(launch)
