"""CUDA templates for row programs whose rows one block (or one warp) handles: `rows` (reduced dims innermost: a
warp or a block per row) and `columns` (reduced dims in the middle: threads across the contiguous inner dim)."""

from __future__ import annotations

from runner.catalog.cgen import Emitter, NotExpressible, full_output, plan_passes
from runner.catalog.cuda import (
    CudaParams,
    _align_check,
    _forward,
    _Loads,
    _row_result,
    _value_decls,
    _vec_inputs,
    pass_feed,
)
from runner.catalog.ir import Program

# ---- rows -----------------------------------------------------------------------------------------------------------


def render_rows(p: Program, params: CudaParams, out_t: str) -> str:
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
    {_value_decls(plan, pno)}""")
        loads.used.clear()
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


def render_columns(p: Program, params: CudaParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("columns is for row programs")
    CW, RS, U = params.col_width, params.slices, params.unroll
    T = CW * RS
    if U not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {U}")
    unroll = f"#pragma unroll {U}\n" if U > 1 else ""  # (U = 1: the compiler's own unrolling; a pragma of 1 stops it)
    if T > 1024 or T % 32:
        raise NotExpressible(f"{CW}x{RS} threads")
    plan = plan_passes(p, params.mode)
    loads = _Loads(p, set())
    parts = []
    for pno in range(1, plan.passes + 1):
        accs, body = pass_feed(plan, loads, pno, "\n        ")
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
    if (ok) {{
{unroll}      for (long long r = threadIdx.y; r < a.R; r += {RS}) {{
        const long long flat = (o * a.R + r) * a.I + i; (void)flat;
        {body}
      }}
    }}
    {merge}
    {_value_decls(plan, pno)}""")
    loads.used.clear()
    em = Emitter(loads)
    assert plan.out is not None
    if full_output(p):
        res = em(plan.out)
        lines = "\n        ".join(em.lines)
        out = f"""    if (ok) {{
{unroll}      for (long long r = threadIdx.y; r < a.R; r += {RS}) {{
        const long long flat = (o * a.R + r) * a.I + i;
        {lines}
        (({out_t}*)a.out)[flat] = fb_to<{out_t}>({res});
      }}
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
