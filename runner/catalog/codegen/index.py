"""The index functions of generated sources: where a broadcast, strided, reshaped or rowblock input's element is, and
an Iota's coordinate, without a 64-bit division instruction. A size the source is specialised on is a constant
(fb_fc: the set-up refuses a call with another); any other size is divided by through magic numbers set once per
call (fb_magic); inside a row template the coordinates come from the row's counters o, r, i (fb_coord), so along the
traversed dim they are the loop counter and the rest depends on the row only."""

from __future__ import annotations

from runner.catalog import sizes
from runner.catalog.codegen.used import pieces, used
from runner.catalog.ir import Program


def index_fns(code: str, p: Program, layout: str = "") -> str:
    """The index functions (general_index_fn) `code` (the rest of a source) uses, with `fb_fc`: F's sizes this
    source is specialised on (runner.catalog.sizes: the set-up refuses a call with others) as constants."""
    free = sizes.free_f_dims(p, layout)
    reshaped = "".join(reshaped_index_fn(p, k, free) for k, i in enumerate(p.inputs) if i.terms)
    return used(pieces(fixed_sizes_fn(p, layout) + general_index_fn() + reshaped), code)


def row_spans(p: Program) -> tuple[int, int]:
    """(a0, a1): a row template's o spans F's dims [0, a0), r the reduced dims [a0, a1), i the dims [a1, ndim)."""
    return p.axes[0], p.axes[-1] + 1


def strided_index_code(p: Program, k: int, spans: tuple[int, int] | None) -> str:
    """Input k's element index, a strided or reshaped view: from the flat position, or from counters o, r and i
    spanning F's dims [0, a0), [a0, a1) and [a1, ndim) (`spans`: a row template's, or a flat kernel's vector inside
    one innermost row)."""
    if spans is None:
        return f"fb_tidx{k}(a, flat)" if p.inputs[k].terms else f"fb_sidx(a, {k}, flat)"
    a0, a1 = spans
    return (f"fb_tidx{k}_row(a, {a0}, {a1}, o, r, i)" if p.inputs[k].terms
            else f"fb_sidx_row(a, {k}, {a0}, {a1}, o, r, i)")


def coord_code(p: Program, d: int, spans: tuple[int, int]) -> str:
    """The coordinate along F's dim d from counters o, r, i spanning [0, a0), [a0, a1), [a1, ndim)."""
    a0, a1 = spans
    lo, hi, x = (0, a0, "o") if d < a0 else (a0, a1, "r") if d < a1 else (a1, p.ndim, "i")
    return f"fb_coord(a, {d}, {lo}, {hi}, {x})"


def fixed_sizes_fn(p: Program, layout: str = "") -> str:
    """`fb_fc(d)`: F's size along d where the source is specialised on it, else 0 (read from FbArgs at run time).
    Inlined with a constant d (every loop over dims runs to FB_ND, unrolled), a division by it is a multiply."""
    free = sizes.free_f_dims(p, layout)
    cases = " ".join(f"case {d}: return {p.shape[d]}LL;" for d in range(p.ndim) if d not in free)
    return f"FB_HD long long fb_fc(int d) {{ switch (d) {{ {cases} default: return 0; }} }}\n"


def reshaped_index_fn(p: Program, k: int, free: set[int]) -> str:
    """`fb_tidx{k}` (from the flat position) and `fb_tidx{k}_row` (from counters o, r, i): the element index of input
    k, a reshaped strided view (Input.terms): its coordinates (shifted, from 0: a piece of a concatenation), each term
    (c // div) % mod times its stride with the captured div and mod as constants; a term along a dim that follows the
    call's tensor (runner.catalog.sizes), or that reads a fixed dim whole, is c times its stride."""
    inp = p.inputs[k]
    pad = p.ndim - len(inp.shape)
    follow = {d for d in sizes.free_dims(p, k) if d in free}
    terms = []
    for j, (d, div, mod, st) in enumerate(inp.terms or ()):
        dd = d + pad
        if dd in follow:
            terms.append(f"c[{dd}] * a.tst[{k}][{j}]")
        elif div == 1 and dd not in free and mod >= p.shape[dd]:  # c < F[dd] <= mod
            terms.append(f"c[{dd}] * {st}LL")
        else:
            terms.append(f"(long long)((unsigned long long)c[{dd}] / {div}ULL % {mod}ULL) * {st}LL")
    total = f"a.voff[{k}]{''.join(' + ' + t for t in terms)}"
    return f"""FB_HD long long fb_tidx{k}(const FbArgs& a, long long flat) {{
  long long c[FB_ND > 0 ? FB_ND : 1];
#pragma unroll
  for (int d = FB_ND - 1; d >= 0; --d) {{
    const long long q = fb_qF(a, d, flat), x = flat - q * fb_Fd(a, d) - a.vsh[{k}][d];
    flat = q; c[d] = x < 0 ? 0 : x; }}
  return {total};
}}
FB_HD long long fb_tidx{k}_row(const FbArgs& a, int a0, int a1, long long o, long long r, long long i) {{
  long long c[FB_ND > 0 ? FB_ND : 1];
#pragma unroll
  for (int d = FB_ND - 1; d >= 0; --d) {{
    const long long x = fb_rcoord(a, d, a0, a1, o, r, i) - a.vsh[{k}][d];
    c[d] = x < 0 ? 0 : x; }}
  return {total};
}}
"""


def general_index_fn() -> str:
    """Index arithmetic without a division instruction: a size is either a constant (fb_fc) or divided by through its
    magic numbers (fb_magic, set once per call); coordinates of a flat position along F's dims (Iota), the element
    index of a strided view, of a reshaped view and of a broadcast input."""
    return division_fns() + """FB_HD long long fb_iota(const FbArgs& a, int d, long long flat) {
#pragma unroll
  for (int k = FB_ND - 1; k >= 0; --k) if (k > d) flat = fb_qF(a, k, flat);
  return flat - fb_qF(a, d, flat) * fb_Fd(a, d);
}
// x's coordinate along F's dim d, x a position over dims [lo, hi) merged (a row template's o, r or i): no division
// by the sizes outside the span, and none at all along its outermost dim
FB_HD long long fb_coord(const FbArgs& a, int d, int lo, int hi, long long x) {
#pragma unroll
  for (int k = FB_ND - 1; k >= 0; --k) if (k > d && k < hi) x = fb_qF(a, k, x);
  return d == lo ? x : x - fb_qF(a, d, x) * fb_Fd(a, d);
}
// the coordinate along d of a row template's position (o, r, i)
FB_HD long long fb_rcoord(const FbArgs& a, int d, int a0, int a1, long long o, long long r, long long i) {
  return d < a0 ? fb_coord(a, d, 0, a0, o) : d < a1 ? fb_coord(a, d, a0, a1, r) : fb_coord(a, d, a1, FB_ND, i);
}
// a broadcast input's element at counters (o, r, i): its coordinates times its strides (0 along broadcast dims)
FB_HD long long fb_bidx_row(const FbArgs& a, int k, int a0, int a1, long long o, long long r, long long i) {
  long long idx = 0;
#pragma unroll
  for (int d = FB_ND - 1; d >= 0; --d) if (a.st[k][d]) idx += fb_rcoord(a, d, a0, a1, o, r, i) * a.st[k][d];
  return idx;
}
// a strided view's element at a row template's (o, r, i): its terms along o's dims are the same for the whole row
FB_HD long long fb_sidx_row(const FbArgs& a, int k, int a0, int a1, long long o, long long r, long long i) {
  long long idx = a.voff[k];
#pragma unroll
  for (int d = FB_ND - 1; d >= 0; --d) {
    const long long n = a.vsz[k][d];
    if (n == 1) continue;
    long long c = fb_rcoord(a, d, a0, a1, o, r, i) - a.vsh[k][d];
    c = c < 0 ? 0 : (c >= n ? n - 1 : c);
    idx += c * a.vst[k][d];
  }
  return idx;
}
FB_HD long long fb_sidx(const FbArgs& a, int k, long long flat) {
  long long idx = a.voff[k];
#pragma unroll
  for (int d = FB_ND - 1; d >= 0; --d) {
    const long long q = fb_qF(a, d, flat);
    long long c = flat - q * fb_Fd(a, d);
    flat = q;
    const long long n = a.vsz[k][d];
    if (n != 1) { c -= a.vsh[k][d]; c = c < 0 ? 0 : (c >= n ? n - 1 : c); idx += c * a.vst[k][d]; }
  }
  return idx;
}
FB_HD long long fb_bidx(const FbArgs& a, int k, long long flat) {
  const int n = a.gnd[k];
  long long idx = 0;
#pragma unroll
  for (int d = 0; d < FB_ND; ++d) {
    if (d >= n) break;
    const long long q = fb_udiv(flat, a.gM[k][d], a.gS[k][d]);
    idx += (flat - q * a.gF[k][d]) * a.gst[k][d];
    flat = q;
  }
  return idx;
}
""" + rowblock_index_fns()


def division_fns() -> str:
    """A 64-bit index divided by a size that is not a compile-time constant, without a division instruction: the
    size's magic numbers (fb_magic, on the host, once per call) then a multiply-high, an add and a shift; by F's size
    along a dim (fb_qF), a constant where the source is specialised on it (fb_fc)."""
    return """// (host) d's magic numbers: n / d = (umulhi(n, M) + n) >> S for every 0 <= n < 2^63 (d >= 1); a small cache, as
// the sizes of consecutive calls repeat
static void fb_magic(long long d, unsigned long long* M, int* S) {
  static thread_local long long cd[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  static thread_local unsigned long long cm[8];
  static thread_local int cs[8];
  const unsigned long long u = d > 0 ? (unsigned long long)d : 1ULL;
  const int h = (int)(u & 7);
  if ((unsigned long long)cd[h] == u) { *M = cm[h]; *S = cs[h]; return; }
  int s = 0;
  while (s < 63 && (1ULL << s) < u) ++s;
  const unsigned __int128 num = ((unsigned __int128)1 << 64) * (((unsigned __int128)1 << s) - u);
  cd[h] = (long long)u; cm[h] = (unsigned long long)(num / u) + 1; cs[h] = s;
  *M = cm[h]; *S = s;
}
FB_HD long long fb_udiv(long long n, unsigned long long M, int S) {
  const unsigned long long u = (unsigned long long)n;
#ifdef __CUDA_ARCH__
  return (long long)((__umul64hi(u, M) + u) >> S);
#else
  return (long long)(((unsigned long long)(((unsigned __int128)u * M) >> 64) + u) >> S);
#endif
}
FB_HD long long fb_Fd(const FbArgs& a, int d) { const long long c = fb_fc(d); return c ? c : a.F[d]; }
// n / F[d] for 0 <= n < 2^63
FB_HD long long fb_qF(const FbArgs& a, int d, long long n) {
  const long long c = fb_fc(d);
  return c ? n / c : fb_udiv(n, a.fM[d], a.fS[d]);
}
"""


def rowblock_index_fns() -> str:
    """A rowblock input's index: its offset at the row's start (once per row: a division per outer dim) and the
    run r // bL it is in (a multiply-high and a shift on the GPU); a rowper input's, r % bL the same way."""
    return """FB_HD long long fb_obase(const FbArgs& a, int k, long long o) {
  long long idx = 0;
#pragma unroll
  for (int d = FB_ND - 1; d >= 0; --d) {
    if (d >= a.a0) continue;
    const long long q = fb_qF(a, d, o);
    idx += (o - q * fb_Fd(a, d)) * a.st[k][d];
    o = q;
  }
  return idx;
}
// (host) run length L < 2^31 and its magic numbers: r / L = (umulhi(r, M) + r) >> S for every r < 2^31
static void fb_set_runs(FbArgs& a, int k, long long L) {
  a.bL[k] = (unsigned)(L > 0 ? L : 1);
  int sh = 0;
  while ((1ULL << sh) < a.bL[k]) ++sh;
  a.bS[k] = sh;
  a.bM[k] = (unsigned)(((1ULL << 32) * ((1ULL << sh) - a.bL[k])) / a.bL[k] + 1);
}
FB_HD unsigned fb_rbq(const FbArgs& a, int k, long long r) {
#ifdef __CUDA_ARCH__
  const unsigned n = (unsigned)r;
  return (__umulhi(n, a.bM[k]) + n) >> a.bS[k];
#else
  return (unsigned)((unsigned long long)r / a.bL[k]);
#endif
}
// a rowper input's index r % P (P in bL: its period inside the row)
FB_HD long long fb_rper(const FbArgs& a, int k, long long r) { return r - (long long)fb_rbq(a, k, r) * a.bL[k]; }
"""

