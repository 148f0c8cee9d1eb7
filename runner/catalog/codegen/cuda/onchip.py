"""A row's slice held in one block's shared memory, the pieces `cluster` and `grid` share: filling the slice
(cp.async, whole vectors or 16-byte pieces of a misaligned row), the passes over it, the output from it and the launch's
sizing of its buffers."""

from __future__ import annotations

from runner.catalog.codegen.common import full_output, row_result, stored
from runner.catalog.codegen.cuda.common import Loads, More, emitter, spaced
from runner.catalog.ir import Program

_SIZES = {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8, "bool": 1, "uint8": 1, "int8": 1}


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
    return (kinds <= {"full", "scalar", "outer"} and all(ctype[k] == "float" for k in cached) and out_t == "float"
            and not p.more)


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


def slice_reads(loads: Loads, ctype: dict[int, str], cached: list[int], v: int) -> str:
    """Vectors at r0 of the inputs the code emitted since the last clear() reads: a cached input's from its slice
    buffer, any other's (a row vector, the same place in every row) through the read-only path."""
    out = []
    for k in sorted(loads.used - loads.blk):
        t = ctype[k]
        out.append(f"const FbVec<{t}, {v}> v{k} = *(const FbVec<{t}, {v}>*)(s{k} + (r0 - lo));" if k in cached else
                   f"const FbVec<{t}, {v}> v{k} = fb_ldv<{t}, {v}>((const {t}*)a.in[{k}] + r0);")
    out.append(loads.block_decls("r0", v))
    return "\n        ".join(out)


def slice_pass(plan, loads: Loads, pno: int, decls, v: int, T: int, unroll: str, chunks: int = 1,
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
        em = emitter(loads)
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


def slice_output(p: Program, plan, loads: Loads, decls, v: int, T: int, unroll: str, out_t: str, first: str,
                 refill: str = "", chunks: int = 1, mid: bool = False) -> str:
    """The output from the slice after the last pass: a full output vector by vector over [lo, hi) (`decls(v)`
    declares the inputs' vectors at r0; `refill` runs after each vector's store: the thread's next row copied into
    the positions it has just read), or a per-row output by thread 0 of the block where `first` holds. chunks K > 1
    (with a refill): the positions in slice_fill's K parts, a commit group closed after each but the last (the
    caller's commit closes it), so the next row's first pass can take them part by part."""
    loads.used.clear()
    em = emitter(loads)
    assert plan.out is not None
    more = More(p)
    if full_output(p):
        res = em(stored(plan.out, p.out_dtype))
        more.values(em, plan.more)
        lines = "\n          ".join(em.lines)

        def body(w: int) -> str:
            return f"""{{
        {decls(w)}
        FbVec<{out_t}, {w}> ov;{spaced(more.decls(w))}
#pragma unroll
        for (int j = 0; j < {w}; ++j) {{
          const long long r = r0 + j, flat = o * a.R + r; (void)flat;
          {lines}
          ov.v[j] = fb_to<{out_t}>({res});{spaced(more.sets())}
        }}
        fb_stv<{out_t}, {w}>(({out_t}*)a.out + o * a.R + r0, ov);{spaced(more.stores(w, "o * a.R + r0"))}
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
    em = emitter(Loads(p, set()))
    res = row_result(p, plan, em)
    more.values(em, plan.more)
    lines = "\n      ".join(em.lines)
    return f"""    if ({first} && threadIdx.x == 0) {{
      const long long r = 0, flat = o * a.R; (void)r; (void)flat;
      {lines}
      (({out_t}*)a.out)[row] = fb_to<{out_t}>({res});{spaced(more.scalar_stores("row"))}
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
