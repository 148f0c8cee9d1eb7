"""CUDA template `rows`: a row program whose reduced dims are innermost (I = 1), a warp (GROUP=32) or a whole block
per row, vector loads along the row, warp-shuffle then shared-memory merges of the accumulators."""

from __future__ import annotations

from runner.catalog.codegen.common import NotExpressible, full_output, plan_passes, row_result, stored
from runner.catalog.codegen.cuda.common import (
    Loads,
    More,
    align_check,
    emitter,
    forward,
    pass_feed,
    row_bases,
    spaced,
    value_decls,
    vec_inputs,
)
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.codegen.cuda.totals import Totals
from runner.catalog.ir import Program


def render_rows(p: Program, params: CudaParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("rows is for row programs")
    V, T = params.vec, params.threads
    G = params.group or T
    if G not in (32, T):
        raise NotExpressible("a row is handled by a warp or by the whole block")
    plan = plan_passes(p, params.mode)
    tot = Totals(p, plan)
    vec_in = vec_inputs(p, ("full", "rowvec", "rowper"))
    kernels = []
    for v in sorted({1, V}):
        loads = Loads(p, vec_in if v > 1 else set())
        parts = []
        for pno in range(1, plan.passes + 1):
            accs, body = pass_feed(plan, loads, pno, "\n          ")
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
    {value_decls(plan, pno)}""")
        loads.used.clear()
        em = emitter(loads)
        assert plan.out is not None
        more = More(p)
        at = "(o * a.R + r0) * a.I + i" if v == 1 else "o * a.R + r0"  # (the scalar kernel serves I > 1 too)
        if full_output(p):
            res = em(stored(plan.out, p.out_dtype))
            more.values(em, plan.more)
            lines = "\n          ".join(em.lines)
            out = f"""    for (long long r0 = (long long)lane * {v}; r0 < a.R; r0 += {G}LL * {v}) {{
        {loads.vector_decls("(o * a.R + r0)", v) if v > 1 else ""}
        FbVec<{out_t}, {v}> ov;{spaced(more.decls(v))}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = (o * a.R + r) * a.I + i; (void)flat;
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});{spaced(more.sets())}
        }}
        if ({v} == 1) (({out_t}*)a.out)[(o * a.R + r0) * a.I + i] = ov.v[0];
        else fb_stv<{out_t}, {v}>(({out_t}*)a.out + o * a.R + r0, ov);{spaced(more.stores(v, at))}
    }}"""
        else:
            em = emitter(Loads(p, set()))
            if tot:  # each Total's per-row value to the workspace; fb_totals writes the output
                stores = tot.row_stores(em)
            else:
                res = row_result(p, plan, em)
                more.values(em, plan.more)
                stores = [f"(({out_t}*)a.out)[row] = fb_to<{out_t}>({res});{spaced(more.scalar_stores('row'))}"]
            lines = "\n      ".join(em.lines + stores)
            out = f"""    if (lane == 0) {{
      const long long r = 0, flat = o * a.R * a.I + i; (void)r; (void)flat;
      {lines}
    }}"""
        passes = "\n".join(parts)
        kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_rows_v{v}(FbArgs a{tot.param()}) {{
  const int lane = threadIdx.x % {G};
  const long long rows = a.O * a.I;
  const int gpb = {T} / {G};
  for (long long row = (long long)blockIdx.x * gpb + threadIdx.x / {G}; row < rows; row += (long long)gridDim.x * gpb) {{
    const long long o = fb_udiv(row, a.iM, a.iS), i = row - o * a.I;
    {row_bases(p)}
{passes}
{out}
  }}
}}
""")
    rows_per_block = T // G
    ok = align_check(p, vec_in, out_t, V, f"a.I == 1 && a.R % {V} == 0")
    launch = f"""  const long long rows = a.O * a.I;
  if (rows == 0) return 0;
{tot.prepare()}  long long blocks = (rows + {rows_per_block} - 1) / {rows_per_block};
  if (blocks > 0x7fffffffLL) blocks = 0x7fffffffLL;
  const bool wide = {V} > 1 && ({ok});
  if (wide) fb_rows_v{V}<<<(unsigned)blocks, {T}, 0, s>>>(a{tot.arg()});
  else fb_rows_v1<<<(unsigned)blocks, {T}, 0, s>>>(a{tot.arg()});{tot.finish()}"""
    return tot.support(out_t) + "".join(kernels) + forward(launch)
