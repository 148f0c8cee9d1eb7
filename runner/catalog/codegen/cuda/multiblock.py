"""CUDA templates for few long rows: `split` (several blocks per row, partials through a workspace) and `cluster`
(a row held on chip across a thread-block cluster, partials through distributed shared memory)."""

from __future__ import annotations

from runner.catalog.codegen.common import Emitter, NotExpressible, full_output, plan_passes
from runner.catalog.codegen.cuda import (
    CudaParams,
    _align_check,
    _ctype,
    _forward,
    _Loads,
    _row_result,
    _value_decls,
    _vec_inputs,
    row_bases,
    vector_at,
    workspace_code,
)
from runner.catalog.ir import Program

_SIZES = {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "bool": 1, "uint8": 1, "int8": 1}

# ---- split: several blocks per row ------------------------------------------------------------------------------


def render_split(p: Program, params: CudaParams, out_t: str) -> str:
    """Pass k: grid (rows x S) blocks each merge their slice into ws[pass][row][slice]; the next kernel first merges
    the S partials of every earlier accumulator of its row (cheap: S values), then does its own slice."""
    if not p.is_row:
        raise NotExpressible("split is for row programs")
    V, T, S, U = params.vec, params.threads, params.slices, params.unroll
    if U not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {U}")
    plan = plan_passes(p, params.mode)
    vec_in = _vec_inputs(p, ("full", "rowvec", "rowper"))
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
            out.append(_value_decls(plan, pno))
        return "\n    ".join(out)

    kernels = []
    for v in sorted({1, V}):
        if params.interleave:  # block `slice` starts at tile `slice` (T vectors) and steps over all S blocks' tiles
            span_code = f"const long long lo = (long long)slice * {T * v}, hi = a.R;"
        else:
            span_code = f"""const long long chunk = ((a.R + {S} - 1) / {S} + {v} - 1) / {v} * {v};
  const long long lo = slice * chunk, hi = lo + chunk < a.R ? lo + chunk : a.R;"""
        loads = _Loads(p, vec_in if v > 1 else set())
        for pno in range(1, plan.passes + 2):
            mine = [x for x in accs if x.pass_no == pno]
            loads.used.clear()
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
        else fb_stv<{out_t}, {v}>(({out_t}*)a.out + o * a.R + r0, ov);"""
            step = f"""{f"FbVec<{out_t}, {v}> ov;" if last else ""}
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
        em = Emitter(_Loads(p, set()))
        assert plan.out is not None
        res = _row_result(p, plan, em)
        lines = "\n    ".join(em.lines)
        kernels.append(f"""
__global__ void fb_split_finish(FbArgs a, FbWs* ws) {{
  const long long row = blockIdx.x * (long long)blockDim.x + threadIdx.x, o = row, i = 0;
  if (row >= a.O) return;
  const long long r = 0, flat = o * a.R; (void)r; (void)flat;
  {gather(plan.passes + 1, by_block=False)}
  {lines}
  (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});
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
    ok = _align_check(p, vec_in, out_t, V, f"a.R % {V} == 0")
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
    return ws_decl + "".join(kernels) + _forward(launch)


def _split_loop(p: Program, loads: _Loads, v: int, T: int, U: int, step: str, span: int = 1,
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
        t = _ctype(p.inputs[k].dtype)
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


# ---- a row's slice in shared memory (cluster, and cuda_grid's grid) ------------------------------------------------


PADDED_FILL = r"""
// The scalar kernels' fill (a row whose length is not whole vectors, so its slices start anywhere): whole 16-byte
// pieces by cp.async into dst, which is 16-byte aligned, shifted by src's misalignment `pad` (fb_pad16) so that the
// pieces line up; the ragged ends element by element. Threads copy pieces, not the elements they read later: the
// block waits for the fill at a barrier. Pieces are dealt to threads from the 128-byte line holding the first, so
// that each warp's 32 copies cover 4 whole lines instead of straddling 5 (H100, L1 norm's rows of 65535 with the
// middle's loops aligned alike, mid_bounds: 6.25-6.28 ms against 6.35-6.38).
template <typename T> __device__ __forceinline__ int fb_pad16(const void* base, long long elem) {
  return (int)(((unsigned long long)((const T*)base + elem) % 16) / sizeof(T));
}
template <typename T> __device__ __forceinline__ void fb_fill_padded(T* dst, const T* src, long long n, int nthr,
                                                                     int tid) {
  constexpr int E = 16 / sizeof(T);
  const int pad = (int)(((unsigned long long)src % 16) / sizeof(T));
  const T* s0 = src - pad;
  const long long end = pad + n, c0 = (pad + E - 1) / E, c1 = end / E;
  const long long cl = c0 - (long long)(((unsigned long long)s0 / 16 + c0) & 7);  // c0's line's first piece
  for (long long c = cl + tid; c < c1; c += nthr)
    if (c >= c0) __pipeline_memcpy_async(dst + c * E, s0 + c * E, 16);
  if (tid < E) {
    const long long h = pad + tid, t = c1 * E + tid;
    if (h < c0 * E && h < end) dst[h] = s0[h];
    if (t >= c0 * E && t < end) dst[t] = s0[t];
  }
}
"""


def slice_offsets(cached: list[int], ctype: dict[int, str]) -> dict[int, str]:
    """Byte offset of each cached input's slice (`chunk` elements and 16 bytes for a padded fill's shift, 16-byte
    aligned) in one buffer."""
    out, off = {}, "0"
    for k in cached:
        out[k] = off
        off = f"{off} + ((chunk * (long long)sizeof({ctype[k]}) + 15) / 16) * 16 + 16"
    return out


def slice_pointers(cached: list[int], ctype: dict[int, str], v: int) -> str:
    """Each cached input's slice in this row's buffer, `s{k}`, shifted by the padded fill's `pad` in the scalar
    kernels."""
    out = []
    for k, off in slice_offsets(cached, ctype).items():
        t = ctype[k]
        shift = f" + fb_pad16<{t}>(a.in[{k}], row * a.R + lo)" if v == 1 else ""
        out.append(f"{t}* s{k} = ({t}*)(fb_smem + buf * bufbytes + {off}){shift};")
    return " ".join(out)


def slice_copy(p: Program, ctype: dict[int, str], cached: list[int], v: int, row: str, buf: str) -> str:
    """Start copying the vector at r0 of `row`'s slice into buffer `buf`: cp.async (16, 8 or 4 bytes, no registers)
    where the access size allows, a plain load and store otherwise."""
    body = []
    for k, off in slice_offsets(cached, ctype).items():
        dst = f"fb_smem + ({buf}) * bufbytes + {off} + (r0 - lo) * (long long)sizeof({ctype[k]})"
        src = f"(const {ctype[k]}*)a.in[{k}] + ({row}) * a.R + r0"
        width = v * _SIZES.get(p.inputs[k].dtype, 4)
        body.append(f"__pipeline_memcpy_async({dst}, {src}, {width});" if width in (4, 8, 16) else
                    f"*(FbVec<{ctype[k]}, {v}>*)({dst}) = *(const FbVec<{ctype[k]}, {v}>*)({src});")
    return " ".join(body)


def chunk_steps(v: int, T: int) -> str:
    """The declaration of fb_nit, the slice's number of steps (T vectors of v each) that chunk_loop cuts in parts."""
    return f"const long long fb_nit = (hi - lo + {T}LL * {v} - 1) / ({T}LL * {v});"


def chunk_loop(v: int, T: int, k: int, K: int) -> str:
    """The header of a loop over part k of K of the thread's own positions r0 in [lo, hi) (lo + (it * T +
    threadIdx.x) * v for `it` in part k of the slice's steps): the fill and the first pass cut alike."""
    return (f"for (long long it = fb_nit * {k} / {K}, r0 = lo + (it * {T} + threadIdx.x) * {v}; "
            f"it < fb_nit * {k + 1} / {K} && r0 < hi; ++it, r0 += {T}LL * {v})")


def mid_ok(p: Program, ctype: dict[int, str], cached: list[int], out_t: str) -> bool:
    """Can the scalar kernel (a row that is not whole vectors) run the middle of its slice 4 wide? Every input read
    along the row is on chip (no row vector or general index read from memory at r0) and 4 bytes, as the output is."""
    kinds = {p.access(k) for k in range(len(p.inputs))}
    return kinds <= {"full", "scalar", "outer"} and all(ctype[k] == "float" for k in cached) and out_t == "float"


def mid_bounds(cached: list[int]) -> str:
    """(v1 kernels, with mid_ok) this row's [fb_m0, fb_m1): the slice's 16-byte aligned stretch, whole float4s, where
    the passes and the output go 4 wide; empty unless every input's and the output's base is 16-byte aligned
    (fb_vmid), so that the row's alignment, which its shifted slice buffer shares, is the same for all of them.
    fb_mb: the start of the 128-byte line holding fb_m0, where mid_loops deal the middle's vectors from."""
    pad = f"fb_pad16<float>(a.in[{cached[0]}], row * a.R + lo)"
    line = f"(long long)(((unsigned long long)((const float*)a.in[{cached[0]}] + row * a.R + fb_m0) % 128) / 4)"
    return (f"const long long fb_a0 = lo + ((4 - {pad}) & 3), fb_m0 = fb_vmid && fb_a0 < hi ? fb_a0 : hi, "
            f"fb_m1 = fb_m0 + ((hi - fb_m0) & ~3LL), fb_mb = fb_m0 - {line};")


def mid_flag(cached: list[int]) -> str:
    ptrs = " | ".join([f"(unsigned long long)a.in[{k}]" for k in cached] + ["(unsigned long long)a.out"])
    return f"const bool fb_vmid = (({ptrs}) & 15) == 0;"


def mid_loops(T: int, unroll: str, inner) -> str:
    """The scalar kernel's loop over its positions as three: the head [lo, fb_m0) and tail [fb_m1, hi) one element at
    a time, the middle 4 wide (a thread's positions still increase, as an argmax's ties need), its vectors dealt from
    fb_m0's 128-byte line (fb_mb) so that each warp's loads and stores cover whole lines."""
    return (f"{unroll}    for (long long r0 = lo + (long long)threadIdx.x; r0 < fb_m0; r0 += {T}LL) {inner(1)}\n"
            f"{unroll}    for (long long r0 = fb_mb + (long long)threadIdx.x * 4; r0 < fb_m1; r0 += {T}LL * 4)\n"
            f"      if (r0 >= fb_m0) {inner(4)}\n"
            f"{unroll}    for (long long r0 = fb_m1 + (long long)threadIdx.x; r0 < hi; r0 += {T}LL) {inner(1)}")


def slice_fill(p: Program, ctype: dict[int, str], cached: list[int], v: int, T: int, row: str, buf: str,
               chunks: int = 1) -> str:
    """Start copying `row`'s slice [lo, hi) into buffer `buf`, every vector of it in flight at once. Each thread
    copies the vectors it later reads (r0 = lo + threadIdx.x * v, stepping T * v): a thread owns its positions. The
    scalar kernels copy 16-byte pieces instead (fb_fill_padded), whoever reads them. chunks K > 1: the copies in K
    commit groups, the caller's own commit closing the last, so that a pass can wait for them part by part."""
    if chunks > 1 and v > 1:
        parts = [chunk_loop(v, T, k, chunks) + " { " + slice_copy(p, ctype, cached, v, row, buf) + " }"
                 + (" __pipeline_commit();" if k < chunks - 1 else "") for k in range(chunks)]
        return f"{chunk_steps(v, T)} " + " ".join(parts)
    if v == 1:
        return " ".join(f"fb_fill_padded<{ctype[k]}>(({ctype[k]}*)(fb_smem + ({buf}) * bufbytes + {off}), "
                        f"(const {ctype[k]}*)a.in[{k}] + ({row}) * a.R + lo, hi - lo, {T}, (int)threadIdx.x);"
                        for k, off in slice_offsets(cached, ctype).items())
    return (f"for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {{ "
            + slice_copy(p, ctype, cached, v, row, buf) + " }")


def slice_turn(p: Program, ctype: dict[int, str], cached: list[int], v: int, T: int, nxt: str) -> str:
    """The start of a row's turn: with two buffers the block's next row (`nxt`) starts streaming into the other one;
    then the block waits for this row's slice (its own copies, then a barrier for everyone's)."""
    return f"""if (nbuf == 2) {{
      if ({nxt} < a.O) {{ {slice_fill(p, ctype, cached, v, T, nxt, "buf ^ 1")} }}
      __pipeline_commit();
      __pipeline_wait_prior(1);
    }} else {{
      __pipeline_wait_prior(0);
    }}
    __syncthreads();"""


def slice_reads(loads: _Loads, ctype: dict[int, str], cached: list[int], v: int) -> str:
    """Vectors at r0 of the inputs the code emitted since the last clear() reads: a cached input's from its slice
    buffer, any other's (a row vector, the same place in every row) through the read-only path."""
    out = []
    for k in sorted(loads.used - loads.blk):
        t = ctype[k]
        out.append(f"const FbVec<{t}, {v}> v{k} = *(const FbVec<{t}, {v}>*)(s{k} + (r0 - lo));" if k in cached else
                   f"const FbVec<{t}, {v}> v{k} = fb_ldv<{t}, {v}>((const {t}*)a.in[{k}] + r0);")
    out.append(loads.block_decls("r0", v))
    return "\n        ".join(out)


def slice_pass(plan, loads: _Loads, pno: int, decls, v: int, T: int, unroll: str, chunks: int = 1,
               mid: bool = False) -> tuple[list, str]:
    """Pass `pno` over the block's slice on chip: its accumulators and the loop(s) feeding them. A Welford (mean and
    variance) accumulator takes its thread's values in two local passes, a sum then the squared deviations from the
    thread's own mean (a second read of shared memory instead of a division per element); merges are unchanged.
    chunks K > 1 (the first pass of a slice filled by slice_fill in K parts): part k waits for its own commit group
    only (`__pipeline_wait_prior(K - 1 - k)`); a thread reads the positions it copied, so no block barrier."""
    accs = [x for x in plan.accs if x.pass_no == pno]
    welford = [x for x in accs if x.kind == "AccWelford"]

    def loop(adds, parts: int = 1) -> str:
        loads.used.clear()
        em = Emitter(loads)
        lines = [f"{x.name}.{fn}({em(x.arg)}{', r' if fn == 'add' else ''});" for x, fn in adds]
        body = "\n          ".join(em.lines + lines)

        def inner_of(w: int) -> str:
            return f"""{{
        {decls(w)}
#pragma unroll
        for (int j = 0; j < {w}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {body}
        }}
    }}"""
        inner = inner_of(v)
        if mid and v == 1:
            return mid_loops(T, unroll, inner_of)
        if parts == 1:
            return f"{unroll}    for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {inner}"
        head = f"    {{ {chunk_steps(v, T)}\n"
        return head + "\n".join(f"    __pipeline_wait_prior({parts - 1 - k});\n{unroll}    {chunk_loop(v, T, k, parts)} {inner}"
                                 for k in range(parts)) + " }"

    code = loop([(x, "add_sum" if x in welford else "add") for x in accs], chunks)
    if welford:
        code += "\n    " + " ".join(f"{x.name}.center();" for x in welford) + "\n" + loop([(x, "add_dev") for x in welford])
    return accs, code


def slice_output(p: Program, plan, loads: _Loads, decls, v: int, T: int, unroll: str, out_t: str, first: str,
                 refill: str = "", chunks: int = 1, mid: bool = False) -> str:
    """The output from the slice after the last pass: a full output vector by vector over [lo, hi) (`decls(v)`
    declares the inputs' vectors at r0; `refill` runs after each vector's store: the thread's next row copied into
    the positions it has just read), or a per-row output by thread 0 of the block where `first` holds. chunks K > 1
    (with a refill): the positions in slice_fill's K parts, a commit group closed after each but the last (the
    caller's commit closes it), so the next row's first pass can take them part by part."""
    loads.used.clear()
    em = Emitter(loads)
    assert plan.out is not None
    if full_output(p):
        res = em(plan.out)
        lines = "\n          ".join(em.lines)

        def body(w: int) -> str:
            return f"""{{
        {decls(w)}
        FbVec<{out_t}, {w}> ov;
#pragma unroll
        for (int j = 0; j < {w}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});
        }}
        fb_stv<{out_t}, {w}>(({out_t}*)a.out + o * a.R + r0, ov);
        {refill}
    }}"""
        if mid and v == 1 and not refill:
            return mid_loops(T, unroll, body)
        if chunks > 1:
            loops = [f"{unroll}    {chunk_loop(v, T, k, chunks)} {body(v)}"
                     + ("\n    __pipeline_commit();" if k < chunks - 1 else "") for k in range(chunks)]
            return (f"    {{ {chunk_steps(v, T)}\n"
                    + "\n".join(loops) + " }")
        return f"{unroll}    for (long long r0 = lo + (long long)threadIdx.x * {v}; r0 < hi; r0 += {T}LL * {v}) {body(v)}"
    em = Emitter(_Loads(p, set()))
    res = _row_result(p, plan, em)
    lines = "\n      ".join(em.lines)
    return f"""    if ({first} && threadIdx.x == 0) {{
      const long long r = 0, flat = o * a.R; (void)r; (void)flat;
      {lines}
      (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});
    }}"""


def slice_sizes(layout: str, ctype: dict[int, str], cached: list[int], ok: str, V: int, S: int,
                buffers: int) -> str:
    """Launch code: the vector width (V where `ok` holds), a slice of the row for each of S blocks (`chunk`), its
    buffer's bytes and the buffers that fit a block's shared memory (`nbuf`, `smem`), or error 4 when one does not."""
    sizes = " + ".join(f"((chunk * (long long)sizeof({ctype[k]}) + 15) / 16) * 16 + 16" for k in cached)
    return f"""  if (a.I != 1) {{ snprintf(fb_err, sizeof fb_err, "{layout} needs the reduced dims innermost"); return 1; }}
  if (a.O == 0) return 0;
  const bool wide = {V} > 1 && ({ok});
  const int v = wide ? {V} : 1;
  const long long chunk = ((a.R + {S} - 1) / {S} + v - 1) / v * v;
  const long long bufbytes = {sizes};
  const int nbuf = {buffers} == 2 && 2 * bufbytes <= 227 * 1024 ? 2 : 1;
  const long long smem = nbuf * bufbytes;
  if (smem > 227 * 1024) {{
    snprintf(fb_err, sizeof fb_err, "a slice of %lld elements needs %lld bytes of shared memory", chunk, smem);
    return 4;
  }}"""


# ---- cluster: a row held on chip across a thread-block cluster --------------------------------------------------


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
    cached = sorted(_vec_inputs(p, ("full",)))
    if not cached:
        raise NotExpressible("nothing to keep on chip")
    ctype = {k: _ctype(p.inputs[k].dtype) for k in cached}
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
        loads = _Loads(p, set(cached))
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
    {_value_decls(plan, pno)}""")
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
    ok = _align_check(p, set(cached), out_t, V, f"a.R % {V} == 0")
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
    return PADDED_FILL + "".join(kernels) + _forward(launch)
