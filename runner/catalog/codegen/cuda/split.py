"""CUDA template `split`: few long rows (I = 1), each row cut into S slices, one block per slice; slice partials go
to a workspace and the next pass (or the output pass) merges them, so all SMs work even with 16 rows."""

from __future__ import annotations

from runner.catalog.codegen.common import NotExpressible, full_output, plan_passes, row_result, stored
from runner.catalog.codegen.cuda.common import (
    Loads,
    More,
    align_check,
    ctype_of,
    emitter,
    forward,
    row_bases,
    spaced,
    value_decls,
    vec_inputs,
    vector_at,
    workspace_code,
)
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.ir import Program


def render_split(p: Program, params: CudaParams, out_t: str) -> str:
    """Pass k: grid (rows x S) blocks each merge their slice into ws[pass][row][slice]; the next kernel first merges
    the S partials of every earlier accumulator of its row (cheap: S values), then does its own slice."""
    if not p.is_row:
        raise NotExpressible("split is for row programs")
    V, T, S, U = params.vec, params.threads, params.slices, params.unroll
    if U not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {U}")
    plan = plan_passes(p, params.mode)
    vec_in = vec_inputs(p, ("full", "rowvec", "rowper"))
    accs = plan.accs
    ws_decl = workspace_code(' '.join(f'{x.kind} {x.name};' for x in accs))

    once = params.grid == "once" and full_output(p)

    def block_merge(x) -> str:
        """The block's threads share a row's S partials of accumulator x, then a block merge."""
        return (f"{x.kind} {x.name}; {x.name}.init(); "
                f"for (int q = threadIdx.x; q < {S}; q += {T}) {x.name}.merge(ws[row * {S} + q].{x.name}); "
                f"fb_block_reduce<{x.kind}, {T}>({x.name});")

    def gather(upto: int, by_block: bool = True, merged: bool = False) -> str:
        """Merge the S partials of accumulators from passes < upto, then compute their values. `by_block`: the
        block's threads work on one row together (the pass kernels; not the finishing kernel, a thread per row).
        `merged`: fb_split_merge already merged them into the row's first slot."""
        out = []
        for x in accs:
            if x.pass_no < upto:
                if merged:
                    out.append(f"{x.kind} {x.name} = ws[row * {S}].{x.name};")
                elif S <= 32 or not by_block:  # a few partials: every thread merges them all
                    out.append(f"{x.kind} {x.name}; {x.name}.init(); "
                               f"for (int q = 0; q < {S}; ++q) {x.name}.merge(ws[row * {S} + q].{x.name});")
                else:  # many: the block's threads share them (a serial walk cost microseconds)
                    out.append(block_merge(x))
        for pno in range(1, upto):
            out.append(value_decls(plan, pno))
        return "\n    ".join(out)

    kernels = []
    for v in sorted({1, V}):
        if params.interleave:  # block `slice` starts at tile `slice` (T vectors) and steps over all S blocks' tiles
            span_code = f"const long long lo = (long long)slice * {T * v}, hi = a.R;"
        else:
            span_code = f"""const long long chunk = ((a.R + {S} - 1) / {S} + {v} - 1) / {v} * {v};
  const long long lo = slice * chunk, hi = lo + chunk < a.R ? lo + chunk : a.R;"""
        loads = Loads(p, vec_in if v > 1 else set())
        more = More(p)
        for pno in range(1, plan.passes + 2):
            mine = [x for x in accs if x.pass_no == pno]
            loads.used.clear()
            em = emitter(loads)
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
                res = em(stored(plan.out, p.out_dtype))
                more.values(em, plan.more)
                body = "\n          ".join(em.lines) + f"\n          ov.v[j] = fb_to<{out_t}>({res});{spaced(more.sets())}"
                decl = ""
                tail = ""
            else:
                continue  # a per-row output is written by the finishing kernel below
            store_out = ""
            if last:
                store_out = f"""
        if ({v} == 1) (({out_t}*)a.out)[o * a.R + r0] = ov.v[0];
        else fb_stv<{out_t}, {v}>(({out_t}*)a.out + o * a.R + r0, ov);{spaced(more.stores(v, "o * a.R + r0"))}"""
            step = f"""{f"FbVec<{out_t}, {v}> ov;{spaced(more.decls(v))}" if last else ""}
#pragma unroll
        for (int j = 0; j < {v}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {body}
        }}{store_out}"""
            if last and once:
                # one tile of T x U vectors per block, blocks in the row's order (like a plain elementwise kernel),
                # the row's values read from the merged slot
                uv = U if v > 1 else 1
                kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_split_p{pno}_v{v}(FbArgs a, FbWs* ws) {{
  const long long tiles = (a.R + {T * v * uv - 1}) / {T * v * uv};
  const long long row = blockIdx.x / tiles, o = row, i = 0;
  {row_bases(p)}
  const long long lo = (blockIdx.x % tiles) * {T * v * uv}, hi = lo + {T * v * uv} < a.R ? lo + {T * v * uv} : a.R;
  {gather(pno, merged=True)}
{_split_loop(p, loads, v, T, uv, step)}
}}
""")
                continue
            # the last pass takes the blocks, and each block its slice, in reverse: what it reads first is what the
            # pass before read last, still in L2
            back = last and pno > 1
            bid = "(gridDim.x - 1 - blockIdx.x)" if back else "blockIdx.x"
            kernels.append(f"""
__global__ void __launch_bounds__({T}) fb_split_p{pno}_v{v}(FbArgs a, FbWs* ws) {{
  const long long row = {bid} / {S}, o = row, i = 0;
  {row_bases(p)}
  const int slice = {bid} % {S};
  {span_code}
  {gather(pno)}
  {decl}
{_split_loop(p, loads, v, T, U if v > 1 else 1, step, S if params.interleave else 1, back)}
{tail}
}}
""")
    if not full_output(p):
        em = emitter(Loads(p, set()))
        assert plan.out is not None
        res = row_result(p, plan, em)
        more = More(p)
        more.values(em, plan.more)
        lines = "\n    ".join(em.lines)
        kernels.append(f"""
__global__ void fb_split_finish(FbArgs a, FbWs* ws) {{
  const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x, o = row, i = 0;
  if (row >= a.O) return;
  const long long r = 0, flat = o * a.R; (void)r; (void)flat;
  {gather(plan.passes + 1, by_block=False)}
  {lines}
  (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});{spaced(more.scalar_stores("row"))}
}}
""")
    if once:
        merge = [block_merge(x) for x in accs]
        kernels.append(f"""
// every accumulator's S partials of a row merged once, into the row's first slot, for the output pass's blocks
__global__ void __launch_bounds__({T}) fb_split_merge(FbArgs a, FbWs* ws) {{
  const long long row = blockIdx.x;
  {chr(10).join("  " + m for m in merge).strip()}
  __syncthreads();
  if (threadIdx.x == 0) {{
    {" ".join(f"ws[row * {S}].{x.name} = {x.name};" for x in accs)}
  }}
}}
""")
    ok = align_check(p, vec_in, out_t, V, f"a.R % {V} == 0")
    steps = []
    for pno in range(1, plan.passes + 1):
        steps.append(f"    if (wide) fb_split_p{pno}_v{V}<<<grid, {T}, 0, s>>>(a, ws); "
                     f"else fb_split_p{pno}_v1<<<grid, {T}, 0, s>>>(a, ws);")
    if once:
        last = plan.passes + 1
        steps.append(f"    fb_split_merge<<<(unsigned)a.O, {T}, 0, s>>>(a, ws);")
        tile = T * V * U
        steps.append(f"    if (wide) fb_split_p{last}_v{V}<<<(unsigned)(a.O * ((a.R + {tile - 1}) / {tile})), {T}, 0, s>>>"
                     f"(a, ws); else fb_split_p{last}_v1<<<(unsigned)(a.O * ((a.R + {T - 1}) / {T})), {T}, 0, s>>>(a, ws);")
    elif full_output(p):
        last = plan.passes + 1
        steps.append(f"    if (wide) fb_split_p{last}_v{V}<<<grid, {T}, 0, s>>>(a, ws); "
                     f"else fb_split_p{last}_v1<<<grid, {T}, 0, s>>>(a, ws);")
    else:
        steps.append("    fb_split_finish<<<(unsigned)((a.O + 127) / 128), 128, 0, s>>>(a, ws);")
    launch = f"""  if (a.I != 1) {{ snprintf(fb_err, sizeof fb_err, "split needs the reduced dims innermost"); return 1; }}
  if (a.O == 0) return 0;
  FbWs* ws = (FbWs*)fb_workspace((size_t)a.O * {S} * sizeof(FbWs), s);
  if (!ws) {{ snprintf(fb_err, sizeof fb_err, "workspace allocation failed"); return 3; }}
  const unsigned grid = (unsigned)(a.O * {S});
  const bool wide = {V} > 1 && ({ok});
  {{
{chr(10).join(steps)}
  }}"""
    return ws_decl + "".join(kernels) + forward(launch)


def _split_loop(p: Program, loads: Loads, v: int, T: int, U: int, step: str, span: int = 1,
                back: bool = False) -> str:
    """A block's walk over its slice [lo, hi) of row o, `step` run at each vector r0, a block's T vectors at a time
    and `span` blocks' worth of vectors between its steps: with U > 1 each thread loads its next U vectors
    (read-only path) before any is used, so U loads per input are in flight. `back`: the block's steps from the
    slice's end to its start (each step's vectors in the same order)."""
    T_ = T * span  # vectors from one step of the block to its next
    stride = T_ * U * v  # elements from one step to the next

    def steps(var: str) -> str:
        first = f"lo + (long long)threadIdx.x * {v}"
        if not back:
            return f"for (long long {var} = {first}; {var} < hi; {var} += {stride}LL)"
        # the last step any thread of the block takes, then down to the first
        return (f"for (long long {var} = {first} + (hi > lo ? (hi - lo - 1) / {stride}LL : -1LL) * {stride}LL; "
                f"{var} >= lo; {var} -= {stride}LL)")

    if U == 1:
        return f"""  {steps("r0")} {{
    if (r0 < hi) {{
        {loads.vector_decls("(o * a.R + r0)", v) if v > 1 else ""}
        {step}
    }}
  }}"""
    arrays, fills, views = [], [], []
    for k in sorted(loads.vec & loads.used):
        t = ctype_of(p.inputs[k].dtype)
        at = vector_at(p, k, "(o * a.R + r0)", "r0")
        arrays.append(f"FbVec<{t}, {v}> u{k}[{U}];")
        fills.append(f"u{k}[u] = fb_ldv<{t}, {v}>((const {t}*)a.in[{k}] + {at});")
        views.append(f"const FbVec<{t}, {v}> v{k} = u{k}[u];")
    views.append(loads.block_decls("r0", v))
    return f"""  {steps("rb")} {{
    {" ".join(arrays)}
#pragma unroll
    for (int u = 0; u < {U}; ++u) {{
      const long long r0 = rb + (long long)u * {T_ * v};
      if (r0 < hi) {{ {" ".join(fills)} }}
    }}
#pragma unroll
    for (int u = 0; u < {U}; ++u) {{
      const long long r0 = rb + (long long)u * {T_ * v};
      if (r0 < hi) {{
        {" ".join(views)}
        {step}
      }}
    }}
  }}"""
