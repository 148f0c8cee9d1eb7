"""CUDA templates for a reduced middle dim (I > 1): `columns` (CW threads across contiguous inner elements, RS
threads splitting the reduced dim, merged through shared memory) and `strided` (V-wide loads at a stride of V rows
where the inner dim is not whole vectors, falling back to the scalar columns kernel)."""

from __future__ import annotations

import re

from runner.catalog.codegen.common import NotExpressible, full_output, plan_passes, row_result, stored
from runner.catalog.codegen.cuda.common import (
    Loads,
    More,
    align_check,
    ctype_of,
    emitter,
    forward,
    pass_feed,
    row_bases,
    spaced,
    value_decls,
    vec_inputs,
    workspace_code,
)
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.ir import Program

# bytes of each accumulator (ACCUMULATORS in codegen/common.py, fb_acc = float): the columns merge keeps one per lane
# and thread
ACC_BYTES = {"AccSum": 4, "AccProd": 4, "AccMax": 4, "AccMin": 4, "AccArgMax": 8, "AccArgMin": 8, "AccLse": 8,
             "AccWelford": 12}
_STATIC_SMEM = 48 * 1024


def _lane_binds(code: str, accs: list, values: list) -> str:
    """Lane j's accumulators and finished values under the names `code` uses (accN, rvN): references into accN_v and
    copies of rvN_v[j]."""
    used = set(re.findall(r"\b(?:acc|rv)\d+\b", code))
    binds = [f"auto& {x.name} = {x.name}_v[j];" for x in accs if x.name in used]
    binds += [f"const {'long long' if x.is_int else 'float'} {x.name} = {x.name}_v[j];" for x in values
              if x.name in used]
    return " ".join(binds)


def _vector_loads(p: Program, loads: Loads, v: int) -> str:
    """Read-only vector loads at `base` of the vector inputs the code emitted since the last clear() reads."""
    out = []
    for k in sorted(loads.vec & loads.used):
        t = ctype_of(p.inputs[k].dtype)
        out.append(f"const FbVec<{t}, {v}> v{k} = fb_ldv<{t}, {v}>((const {t}*)a.in[{k}] + base);")
    out.append(loads.block_decls("r", 1))  # a rowblock input: one value per reduced index r, whatever the columns
    return " ".join(out)


def render_columns(p: Program, params: CudaParams, out_t: str) -> str:
    """Threads (x) across the inner dim, each owning V consecutive columns, and (y) slices of the reduced dim, merged
    through shared memory. The V-wide kernel (vector loads of the full inputs, vector stores) runs when every row is
    whole vectors and the pointers align, the scalar one otherwise."""
    if not p.is_row:
        raise NotExpressible("columns is for row programs")
    CW, RS, U, V = params.col_width, params.slices, params.unroll, params.vec
    T = CW * RS
    if U not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {U}")
    if T > 1024 or T % 32:
        raise NotExpressible(f"{CW}x{RS} threads")
    plan = plan_passes(p, params.mode)
    if RS > 1 and V * T * max(ACC_BYTES[x.kind] for x in plan.accs) > _STATIC_SMEM:
        raise NotExpressible(f"{V} columns x {T} threads of accumulators overflow static shared memory")
    vec_in = vec_inputs(p, ("full",))
    kernels = [_columns_kernel(p, plan, params, out_t, v, vec_in if v > 1 else set()) for v in sorted({1, V})]
    ok = align_check(p, vec_in, out_t, V, f"a.I % {V} == 0", runs=False)
    launch = f"""  const bool wide = {V} > 1 && ({ok});
  const long long width = wide ? {CW * V} : {CW};
  const long long tiles = a.O * ((a.I + width - 1) / width);
  if (tiles == 0) return 0;
  long long blocks = tiles < 0x7fffffffLL ? tiles : 0x7fffffffLL;
  if (wide) fb_cols_v{V}<<<(unsigned)blocks, dim3({CW}, {RS}), 0, s>>>(a);
  else fb_cols_v1<<<(unsigned)blocks, dim3({CW}, {RS}), 0, s>>>(a);"""
    return "".join(kernels) + forward(launch)


def _columns_kernel(p: Program, plan, params: CudaParams, out_t: str, v: int, vec_in: set[int]) -> str:
    """fb_cols_v{v}: thread (x, y) of a tile owns columns i0 .. i0 + v - 1 (a lane j each: accumulators accN_v[j],
    values rvN_v[j]) and the reduced indices r = y, y + RS, ...; `vec_in`: the inputs loaded v-wide."""
    CW, RS, U = params.col_width, params.slices, params.unroll
    unroll = f"#pragma unroll {U}\n" if U > 1 else ""  # (U = 1: the compiler's own unrolling; a pragma of 1 stops it)
    # lanes of every accumulator of the kernel share one buffer, one accumulator merged at a time
    shared = " ".join(f"{x.kind} {x.name}[{RS}][{v}][{CW}];" for x in plan.accs)
    loads = Loads(p, vec_in, runs=False)
    parts = []
    for pno in range(1, plan.passes + 1):
        accs, body = pass_feed(plan, loads, pno, "\n          ")
        earlier = [x for x in plan.values if x.pass_no < pno]
        decl = " ".join(f"{x.kind} {x.name}_v[{v}];" for x in accs)
        init = " ".join(f"{x.name}_v[j].init();" for x in accs)
        # thread (x, y) merges lanes y, y + RS, ... of its columns across the RS slices
        merge = "\n    ".join(
            f"""{{
#pragma unroll
      for (int j = 0; j < {v}; ++j) sh.{x.name}[threadIdx.y][j][threadIdx.x] = {x.name}_v[j];
      __syncthreads();
      for (int j = threadIdx.y; j < {v}; j += {RS}) {{
        {x.kind} m = sh.{x.name}[0][j][threadIdx.x];
        for (int q = 1; q < {RS}; ++q) m.merge(sh.{x.name}[q][j][threadIdx.x]);
        sh.{x.name}[0][j][threadIdx.x] = m;
      }}
      __syncthreads();
#pragma unroll
      for (int j = 0; j < {v}; ++j) {x.name}_v[j] = sh.{x.name}[0][j][threadIdx.x];
      __syncthreads(); }}""" for x in accs) if RS > 1 else ""
        values = value_decls(plan, pno)
        mine = [x for x in plan.values if x.pass_no == pno]
        parts.append(f"""    {decl}
#pragma unroll
    for (int j = 0; j < {v}; ++j) {{ {init} }}
    if (ok) {{
{unroll}      for (long long r = threadIdx.y; r < a.R; r += {RS}) {{
        const long long base = (o * a.R + r) * a.I + i0;
        {_vector_loads(p, loads, v)}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long i = i0 + j, flat = base + j; (void)i; (void)flat;
          {_lane_binds(body, accs, earlier)}
          {body}
        }}
      }}
    }}
    {merge}
    {" ".join(f"{'long long' if x.is_int else 'float'} {x.name}_v[{v}];" for x in mine)}
#pragma unroll
    for (int j = 0; j < {v}; ++j) {{
      {_lane_binds(values, accs, earlier)}
      {values}
      {" ".join(f"{x.name}_v[j] = {x.name};" for x in mine)}
    }}""")
    loads.used.clear()
    em = emitter(loads)
    assert plan.out is not None
    more = More(p)
    if full_output(p):
        res = em(stored(plan.out, p.out_dtype))
        more.values(em, plan.more)
        lines = "\n          ".join(em.lines)
        used = " ".join([lines, res, *more.vals])
        out = f"""    if (ok) {{
{unroll}      for (long long r = threadIdx.y; r < a.R; r += {RS}) {{
        const long long base = (o * a.R + r) * a.I + i0;
        {_vector_loads(p, loads, v)}
        FbVec<{out_t}, {v}> ov;{spaced(more.decls(v))}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long i = i0 + j, flat = base + j; (void)i; (void)flat;
          {_lane_binds(used, [], plan.values)}
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});{spaced(more.sets())}
        }}
        fb_stv<{out_t}, {v}>(({out_t}*)a.out + base, ov);{spaced(more.stores(v, "base"))}
      }}
    }}"""
    else:
        em = emitter(Loads(p, set()))
        res = row_result(p, plan, em)
        more.values(em, plan.more)
        lines = "\n        ".join(em.lines)
        used = " ".join([lines, res, *more.vals])
        out = f"""    if (ok && threadIdx.y == 0) {{
      FbVec<{out_t}, {v}> ov;{spaced(more.decls(v))}
#pragma unroll
      for (int j = 0; j < {v}; ++j) {{
        const long long i = i0 + j, r = 0, flat = o * a.R * a.I + i; (void)i; (void)r; (void)flat;
        {_lane_binds(used, [], plan.values)}
        {lines}
        ov.v[j] = fb_to<{out_t}>({res});{spaced(more.sets())}
      }}
      fb_stv<{out_t}, {v}>(({out_t}*)a.out + o * a.I + i0, ov);{spaced(more.stores(v, "o * a.I + i0"))}
    }}"""
    passes = "\n".join(parts)
    return f"""
__global__ void __launch_bounds__({CW * RS}) fb_cols_v{v}(FbArgs a) {{
  {f"union FbColsSh {{ {shared} }}; __shared__ FbColsSh sh;" if RS > 1 else ""}
  const long long tiles = (a.I + {CW * v} - 1) / {CW * v};
  // the block's tiles (o, t) stepped by the grid's size along the flat tile index: divisions only before the loop
  const long long step_o = gridDim.x / tiles, step_t = gridDim.x % tiles;
  for (long long o = blockIdx.x / tiles, t = blockIdx.x % tiles; o < a.O;
       t += step_t, o += step_o + (t >= tiles), t -= t >= tiles ? tiles : 0) {{
    const long long i0 = t * {CW * v} + threadIdx.x * {v};
    {row_bases(p)}
    const bool ok = i0 < a.I;
{passes}
{out}
  }}
}}
"""


# ---- strided: a middle dim reduced with V-wide loads where the inner dim is not whole vectors -----------------------


def strided_refusal(p: Program, mode: str = "online") -> str | None:
    """Why the strided layout cannot express the program (None when it can): one pass, a value per row, every input
    read at the output's flat index."""
    if not p.is_row:
        return "strided is for row programs"
    if plan_passes(p, mode).passes != 1 or full_output(p):
        return "strided is for one-pass reductions with a value per row"
    if any(p.access(k) != "full" for k in range(len(p.inputs))):
        return "strided reads every input at the output's flat index"
    return None


def render_strided(p: Program, params: CudaParams, out_t: str) -> str:
    """Reduce the middle dim of (O, R, I) where I is not whole vectors (Sum over (128, 4096, 4095)), one pass, a
    value per (o, i): a batch's R x I slab is contiguous, so its period of lcm(I, V) elements (K = lcm / I rows, L =
    lcm / V vectors) tiles it; thread t reads the V-wide vectors at V * t of every period, whose V lanes are always
    the same (row class, column) pairs. G groups of periods per thread set; the partials of a column (K row classes
    x G groups, a group with no period left writing its accumulators' initial values) meet in a workspace, merged by
    a second kernel, a thread per output. Where the slab is not whole periods or a pointer does not align: the scalar
    columns kernel."""
    V, T, G, U = params.vec, params.threads, params.slices, params.unroll
    if U not in (1, 2, 4, 8) or V < 2:
        raise NotExpressible(f"strided with vector width {V}, unroll {U}")
    why = strided_refusal(p, params.mode)
    if why:
        raise NotExpressible(why)
    plan = plan_passes(p, params.mode)
    vec_in = vec_inputs(p, ("full",))
    loads = Loads(p, vec_in, runs=False)
    accs, body = pass_feed(plan, loads, 1, "\n            ")
    fills, views = [], []
    for k in sorted(loads.vec & loads.used):
        t = ctype_of(p.inputs[k].dtype)
        fills.append(f"u{k}[u] = fb_ldv<{t}, {V}>((const {t}*)a.in[{k}] + slab + (m + u) * (L * {V}) + {V} * t);")
        views.append(f"const FbVec<{t}, {V}> v{k} = u{k}[u];")
    arrays = " ".join(f"FbVec<{ctype_of(p.inputs[k].dtype)}, {V}> u{k}[{U}];" for k in sorted(loads.vec & loads.used))
    ws = " ".join(f"{x.kind} {x.name};" for x in accs)
    em = emitter(Loads(p, set()))
    res = row_result(p, plan, em)
    more = More(p)
    more.values(em, plan.more)
    lines = "\n    ".join(em.lines)
    fallback = CudaParams("columns", vec=1, threads=256, col_width=32, slices=8, mode=params.mode, unroll=4)
    kernels = workspace_code(ws) + f"""
// partials: block (o, g, tile), thread t of the period's L vectors; no barriers (a thread past L returns)
__global__ void __launch_bounds__({T}) fb_strd_v{V}(FbArgs a, FbWs* ws, long long K, long long L) {{
  const long long tiles = (L + {T - 1}) / {T}, b = blockIdx.x, tile = b % tiles, g = b / tiles % {G}, o = b / (tiles * {G});
  const long long t = tile * {T} + threadIdx.x;
  if (t >= L) return;
  const long long slab = o * a.R * a.I, M = a.R / K, m0 = g * M / {G}, m1 = (g + 1) * M / {G};
  long long rq[{V}], iq[{V}];  // lane j: its row within a period and its column
#pragma unroll
  for (int j = 0; j < {V}; ++j) {{ rq[j] = ({V} * t + j) / a.I; iq[j] = ({V} * t + j) % a.I; }}
  {" ".join(f"{x.kind} {x.name}_v[{V}];" for x in accs)}
#pragma unroll
  for (int j = 0; j < {V}; ++j) {{ {" ".join(f"{x.name}_v[j].init();" for x in accs)} }}
  for (long long m = m0; m < m1; m += {U}) {{
    {arrays}
#pragma unroll
    for (int u = 0; u < {U}; ++u)
      if (m + u < m1) {{ {" ".join(fills)} }}
#pragma unroll
    for (int u = 0; u < {U}; ++u) {{
      if (m + u < m1) {{
        {" ".join(views)}
#pragma unroll
        for (int j = 0; j < {V}; ++j) {{
          const long long r = (m + u) * K + rq[j], i = iq[j], flat = slab + r * a.I + i; (void)i; (void)flat;
          {_lane_binds(body, accs, [])}
          {body}
        }}
      }}
    }}
  }}
#pragma unroll
  for (int j = 0; j < {V}; ++j) {{
    FbWs& w = ws[(o * {G} + g) * (L * {V}) + {V} * t + j];
    {" ".join(f"w.{x.name} = {x.name}_v[j];" for x in accs)}
  }}
}}

// a thread per output (o, i): its K row classes x G groups merged in a fixed order
__global__ void __launch_bounds__(256) fb_strd_fin(FbArgs a, const FbWs* ws, long long K, long long L) {{
  const long long id = blockIdx.x * 256LL + threadIdx.x;
  if (id >= a.O * a.I) return;
  const long long o = id / a.I, i = id % a.I, r = 0, flat = o * a.R * a.I + i; (void)r; (void)flat;
  {" ".join(f"{x.kind} {x.name}; {x.name}.init();" for x in accs)}
  for (long long q = 0; q < K; ++q)
    for (int g = 0; g < {G}; ++g) {{
      const FbWs& w = ws[(o * {G} + g) * (L * {V}) + q * a.I + i];
      {" ".join(f"{x.name}.merge(w.{x.name});" for x in accs)}
    }}
  {value_decls(plan, 1)}
  {lines}
  (({out_t}*)a.out)[o * a.I + i] = fb_to<{out_t}>({res});{spaced(more.scalar_stores("o * a.I + i"))}
}}
"""
    conds = " && ".join(f"fb_aligned(a.in[{k}], {V} * (int)sizeof({ctype_of(p.inputs[k].dtype)}))" for k in sorted(vec_in))
    launch = f"""  if (a.O * a.I == 0) return 0;
  long long gcd = a.I, rest = {V};
  while (rest) {{ const long long t = gcd % rest; gcd = rest; rest = t; }}
  const long long K = {V} / gcd, L = a.I / gcd, tiles = (L + {T - 1}) / {T};  // a period: K rows, L vectors
  FbWs* ws = 0;
  const bool wide = a.R % K == 0 && a.O * {G} * tiles < 0x7fffffffLL && {conds or "true"}
                    && (ws = (FbWs*)fb_workspace((size_t)(a.O * {G} * L * {V}) * sizeof(FbWs), s)) != 0;
  if (wide) {{
    fb_strd_v{V}<<<(unsigned)(a.O * {G} * tiles), {T}, 0, s>>>(a, ws, K, L);
    fb_strd_fin<<<(unsigned)((a.O * a.I + 255) / 256), 256, 0, s>>>(a, ws, K, L);
  }} else {{
    const long long ctiles = a.O * ((a.I + {fallback.col_width - 1}) / {fallback.col_width});
    const dim3 block({fallback.col_width}, {fallback.slices});
    fb_cols_v1<<<(unsigned)(ctiles < 0x7fffffffLL ? ctiles : 0x7fffffffLL), block, 0, s>>>(a);
  }}"""
    return kernels + _columns_kernel(p, plan, fallback, out_t, 1, set()) + forward(launch)
