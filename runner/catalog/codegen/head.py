"""The fixed C text at the head of every CUDA and C++ source: the argument block and its set-up from the fast ABI
and the math prelude (the index functions are in index.py)."""

from __future__ import annotations

from math import prod

from runner.catalog import sizes
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.ir import Iota, Program, Red, walk
from runner.dtypes import ABI_DTYPES

DTYPE_CODE = ABI_DTYPES


# ---- the argument block and its set-up ---------------------------------------------------------------------


def args_struct(p: Program) -> str:
    nin, nd = max(len(p.inputs), 1), max(p.ndim, 1)
    return f"""#define FB_NIN {len(p.inputs)}
#define FB_ND {p.ndim}
struct FbArgs {{
  const void* in[{nin}];
  void* out;
  void* more[{max(len(p.more), 1)}];  // outputs 1, 2, ...
  long long O, R, I, N;
  long long F[{nd}];
  long long st[{nin}][{nd}];
  int gnd[{nin}];            // a general input's index: its dims merged and listed innermost first
  long long gF[{nin}][{nd}];
  long long gst[{nin}][{nd}];
  int small;                 // every flat index fits in 32 bits: cheaper divisions
  int a0;                    // the first reduced dim: a row's outer position o spans dims [0, a0)
  long long vst[{nin}][{nd}], vsh[{nin}][{nd}], vsz[{nin}][{nd}], voff[{nin}];  // strided views (Input.strides)
  int tn[{nin}], td[{nin}][{2 * nd}];                      // reshaped views (Input.terms): dim, div, mod, stride
  long long tdiv[{nin}][{2 * nd}], tmod[{nin}][{2 * nd}], tst[{nin}][{2 * nd}];
  unsigned bL[{nin}], bM[{nin}];  // a rowblock input: run length inside a row, and its divisor's magic multiplier
  int bS[{nin}];                  // ... and shift (r / bL = (umulhi(r, bM) + r) >> bS for r < 2^31)
  unsigned long long fM[{nd}], gM[{nin}][{nd}];  // F's and gF's magic multipliers and shifts (fb_magic): an index
  int fS[{nd}], gS[{nin}][{nd}];                 // divided by a run-time size without a division instruction
  unsigned long long iM; int iS;                 // ... and I's (a row's outer and inner position from its number)
}};
"""


def setup_code(p: Program, abi_offset: int = 0, layout: str = "") -> str:
    """`static int fb_setup(...)`: checks the ABI tensors and fills FbArgs (F from the inputs' run-time shapes; a view's
    sizes are the captured ones but along the dims runner.catalog.sizes finds free)."""
    nd = p.ndim
    free = sizes.free_f_dims(p, layout)
    lines = ["static char fb_err[512];",
             'FB_EXPORT const char* fusebot_last_error(void) { return fb_err; }',
             "static int fb_fail(const char* msg) { snprintf(fb_err, sizeof fb_err, \"%s\", msg); return 1; }",
             "static int fb_setup(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, FbArgs* ap) {",
             "  FbArgs& a = *ap;",
             "  memset(ap, 0, sizeof *ap);  // every byte set: the block is a kernel parameter a launch plan records",
             f'  if (n_out != {1 + len(p.more)}) return fb_fail("expected {1 + len(p.more)} outputs");',
             f"  long long shp[{max(len(p.inputs), 1)}][{max(nd, 1)}];"]
    for k, inp in enumerate(p.inputs):
        pos = inp.abi + abi_offset
        lines.append(f"  if (n_in <= {pos}) return fb_fail(\"too few inputs\");")
        lines.append(f"  if (in[{pos}].dtype != {DTYPE_CODE.get(inp.dtype, -1)}) return fb_fail(\"input {pos}: "
                     f"expected {inp.dtype}\");")
        lines.append(f"  {{ const fb_tensor& t = in[{pos}]; long long want = 1;")
        lines.append("    for (int d = t.ndim - 1; d >= 0; --d) { if (t.shape[d] != 1 && t.strides[d] != want) "
                     f"return fb_fail(\"input {pos} is not contiguous\"); want *= t.shape[d]; }}")
        if inp.viewed:
            numel = prod(inp.shape)
            pv = p.padded(k)
            if inp.strides is not None:
                numel = inp.base
                for d in range(nd):
                    j = d - (nd - len(inp.shape))
                    st, sh = (inp.strides[j], (inp.shift or (0,) * len(inp.shape))[j]) if j >= 0 else (0, 0)
                    lines.append(f"    a.vst[{k}][{d}] = {st}LL; a.vsh[{k}][{d}] = {sh}LL; a.vsz[{k}][{d}] = {pv[d]}LL;")
                lines.append(f"    a.voff[{k}] = {inp.offset}LL;")
                terms = inp.terms or ()
                if len(terms) > 2 * nd:
                    raise NotExpressible("a reshaped view with more terms than the argument block holds")
                lines.append(f"    a.tn[{k}] = {len(terms)};")
                pad = nd - len(inp.shape)
                for j, (d, div, mod, st) in enumerate(terms):
                    lines.append(f"    a.td[{k}][{j}] = {d + pad}; a.tdiv[{k}][{j}] = {div}LL; "
                                 f"a.tmod[{k}][{j}] = {mod}LL; a.tst[{k}][{j}] = {st}LL;")
            for d in range(nd):
                lines.append(f"    shp[{k}][{d}] = {pv[d]}LL;")
            follow = {d: j for d, j in sizes.free_dims(p, k).items() if d in free}
            merged = {d: js for d, js in sizes.merged_dims(p, k).items() if d in free}
            if follow or merged:  # the view's leading dims (and a merged innermost one) follow the call's tensor
                S = sizes.tensor_shape(inp)
                lines.append(f"    if (t.ndim != {len(S)}) return fb_fail(\"input {pos}: number of dims differs from the "
                             "captured view\");")
                for d, js in merged.items():
                    lines.append(f"    shp[{k}][{d}] = {' * '.join(f't.shape[{j}]' for j in js)};")
                taken = set(follow.values()) | {j for js in merged.values() for j in js}
                for j in sorted(set(range(len(S))) - taken):
                    lines.append(f"    if (t.shape[{j}] != {S[j]}LL) return fb_fail(\"input {pos}: size {j} differs from "
                                 "the captured view\");")
                for d, j in follow.items():
                    lines.append(f"    shp[{k}][{d}] = t.shape[{j}];")
                    if inp.strides is not None:
                        lines.append(f"    {{ long long s = 1; for (int q = t.ndim - 1; q > {j}; --q) s *= t.shape[q]; "
                                     f"a.vst[{k}][{d}] = s; a.vsz[{k}][{d}] = t.shape[{j}];")
                        for jj, term in enumerate(inp.terms or ()):  # a reshaped view: its term along d (sizes.py)
                            if term[0] + nd - len(inp.shape) == d:
                                lines.append(f"      a.tmod[{k}][{jj}] = t.shape[{j}]; a.tst[{k}][{jj}] = s;")
                        lines.append("    }")
            else:
                lines.append(f"    if (want != {numel}LL) return fb_fail(\"input {pos}: size differs from the captured "
                             "view\");")
        else:
            lines.append(f"    if (t.ndim > {nd}) return fb_fail(\"input {pos}: too many dims\");")
            lines.append(f"    for (int d = 0; d < {nd}; ++d) {{ int s = d - ({nd} - t.ndim); "
                         f"shp[{k}][d] = s >= 0 ? t.shape[s] : 1; }}")
        lines.append(f"    a.in[{k}] = t.data; }}")
    if p.inputs:
        # the size of a dim no input gives in the call: the captured one where no input spans it (an index range's, a
        # mask's from its structure, an expand's new dim: inv_freq[None, :, None].expand(B, -1, 1) reads no tensor of
        # B's size), and every dim's where an Iota or a strided view reads F; else 1 (each input broadcast along it)
        keep = any(isinstance(e, Iota) for o in p.outputs for e in walk(o.expr)) or any(i.strides is not None
                                                                                      for i in p.inputs)
        cap = [x if keep or all(p.padded(k)[d] == 1 for k in range(len(p.inputs))) else 1
               for d, x in enumerate(p.shape)]
        lines.append(f"  const long long fcap[{max(nd, 1)}] = {{{', '.join(f'{x}LL' for x in cap) or '1LL'}}};")
        # a strided view keeps its size, but along the dims that follow its tensor (runner.catalog.sizes)
        plain = ", ".join("{" + ", ".join("0" if i.strides is not None and d not in sizes.free_dims(p, k) or
                                          i.strides is not None and d not in free else "1" for d in range(nd)) + "}"
                          for k, i in enumerate(p.inputs))
        lines.append(f"  const int plain[{len(p.inputs)}][{nd}] = {{{plain}}};")
        lines.append(f"  for (int d = 0; d < {nd}; ++d) {{ long long f = 1; int seen = 0;")
        lines.append(f"    for (int k = 0; k < {len(p.inputs)}; ++k) if (plain[k][d] && shp[k][d] != 1) {{ seen = 1; "
                     "if (f != 1 && f != shp[k][d]) return fb_fail(\"inputs do not broadcast\"); f = shp[k][d]; }")
        lines.append("    a.F[d] = seen ? f : fcap[d]; }")
    else:
        for d in range(nd):
            lines.append(f"  a.F[{d}] = {p.shape[d]}LL;")
    for d in sorted(set(range(nd)) - free):  # a dim a view fixes (runner.catalog.sizes) keeps its captured size
        lines.append(f"  if (a.F[{d}] != {p.shape[d]}LL) return fb_fail(\"dim {d} differs from the captured size "
                     f"{p.shape[d]}\");")
    ax = p.axes
    a0, a1 = (ax[0], ax[-1] + 1) if ax else (nd, nd)
    lines.append("  a.O = 1; a.R = 1; a.I = 1;")
    lines.append(f"  for (int d = 0; d < {nd}; ++d) {{ if (d < {a0}) a.O *= a.F[d]; else if (d < {a1}) a.R *= a.F[d]; "
                 "else a.I *= a.F[d]; }")
    lines.append("  a.N = a.O * a.R * a.I;")
    lines.append(f"  for (int d = 0; d < {nd}; ++d) fb_magic(a.F[d], &a.fM[d], &a.fS[d]);")
    lines.append("  fb_magic(a.I, &a.iM, &a.iS);")
    if any(isinstance(e, Red) and e.kind in ("argmax", "argmin") for e in walk(p.out)):
        lines.append("  if (a.R > 0x7fffffffLL) return fb_fail(\"an index along rows of 2^31 or more elements\");")
    for k in range(len(p.inputs)):
        lines.append(f"  {{ long long s = 1; for (int d = {nd} - 1; d >= 0; --d) {{ "
                     f"a.st[{k}][d] = shp[{k}][d] == 1 ? 0 : s; s *= shp[{k}][d]; }} }}")
        kind = p.access(k)
        if kind == "full":
            lines.append(f"  for (int d = 0; d < {nd}; ++d) if (shp[{k}][d] != a.F[d]) "
                         f"return fb_fail(\"input {k}: expected the full shape\");")
        elif kind == "scalar":
            lines.append(f"  for (int d = 0; d < {nd}; ++d) if (shp[{k}][d] != 1) "
                         f"return fb_fail(\"input {k}: expected a single element\");")
        elif kind in ("rowblock", "rowper"):
            # rowblock: constant over runs of L elements inside a row (it varies along the reduced dims before c);
            # rowper: repeats every L elements (it varies along those from c on); L: the reduced dims from c on
            if kind == "rowblock":
                c = p.block_split(k)
                first, varies, what = a0, f"d < {c}", "a per-run"
            else:
                c = p.period_split(k)
                first, varies, what = 0, f"(d >= {c} && d < {a1})", "a repeating"
            lines.append(f"  for (int d = {first}; d < {nd}; ++d) if (shp[{k}][d] != ({varies} ? a.F[d] : 1)) "
                         f"return fb_fail(\"input {k}: broadcast pattern differs from the captured one\");")
            lines.append(f"  {{ long long L = 1; for (int d = {c}; d < {a1}; ++d) L *= a.F[d];")
            lines.append(f"    if (a.R >= 0x7fffffffLL) return fb_fail(\"rows of 2^31 elements or more with {what} "
                         "input\");")
            lines.append(f"    fb_set_runs(a, {k}, L); }}")
        elif kind in ("rowvec", "outer"):
            inside = f"(d >= {a0} && d < {a1})"
            cond = inside if kind == "rowvec" else f"!{inside}"
            lines.append(f"  for (int d = 0; d < {nd}; ++d) if (shp[{k}][d] != ({cond} ? a.F[d] : 1)) "
                         f"return fb_fail(\"input {k}: broadcast pattern differs from the captured one\");")
    lines.append("  a.small = a.N < 0x7fffffffLL;")
    lines.append(f"  a.a0 = {a0};")
    lines.append(f"  for (int k = 0; k < {len(p.inputs)}; ++k) {{  /* merge dims that index like one; stop at broadcast */")
    lines.append("    int n = 0; long long run_sz = 1, run_st = -1;")
    lines.append(f"    for (int d = {nd} - 1; d >= 0; --d) {{")
    lines.append("      long long sz = a.F[d], st = a.st[k][d];")
    lines.append("      if (sz == 1) continue;")
    lines.append("      if (run_st >= 0 && st == run_st * run_sz) { run_sz *= sz; continue; }")
    lines.append("      if (run_st >= 0) { a.gF[k][n] = run_sz; a.gst[k][n] = run_st; ++n; }")
    lines.append("      run_sz = sz; run_st = st;")
    lines.append("    }")
    lines.append("    if (run_st >= 0) { a.gF[k][n] = run_sz; a.gst[k][n] = run_st; ++n; }")
    lines.append("    while (n > 0 && a.gst[k][n - 1] == 0) --n;  /* outer broadcast dims change nothing */")
    lines.append("    a.gnd[k] = n;")
    lines.append("    for (int d = 0; d < n; ++d) fb_magic(a.gF[k][d], &a.gM[k][d], &a.gS[k][d]);")
    lines.append("  }")
    full_out = not p.is_row or p.level(p.out) == "full"
    want = "1" if p.has_totals else "a.N" if full_out else "(a.O * a.I)"
    for j, o in enumerate(p.outputs):
        lines.append(f"  {{ long long n = 1; for (int d = 0; d < out[{j}].ndim; ++d) n *= out[{j}].shape[d];")
        lines.append(f"    if (n != {want}) return fb_fail(\"output {j}: size differs from the program's\"); }}")
        lines.append(f"  if (out[{j}].dtype != {DTYPE_CODE.get(o.dtype, -1)}) return fb_fail(\"output {j}: dtype\");")
        lines.append(f"  a.{'out' if j == 0 else f'more[{j - 1}]'} = out[{j}].data;")
    lines.append("  return 0;")
    lines.append("}")
    return "\n".join(lines) + "\n"


MATH = r"""
#ifdef FB_FAST
FB_HD float fb_exp(float x) { return FB_FAST_EXP(x); }
FB_HD float fb_div(float x, float y) { return FB_FAST_DIV(x, y); }
#ifdef FB_FAST_TANH
FB_HD float fb_tanh(float x) { return FB_FAST_TANH(x); }
#else
FB_HD float fb_tanh(float x) { return 1.0f - fb_div(2.0f, fb_exp(2.0f * x) + 1.0f); }
#endif
FB_HD float fb_log(float x) { return FB_FAST_LOG(x); }
#else
FB_HD float fb_exp(float x) { return expf(x); }
FB_HD float fb_div(float x, float y) { return x / y; }
FB_HD float fb_tanh(float x) { return tanhf(x); }
FB_HD float fb_log(float x) { return logf(x); }
#endif
#ifdef __CUDA_ARCH__
FB_HD fb_acc fb_rcp(fb_acc x) { return __frcp_rn(x); }
#else
FB_HD fb_acc fb_rcp(fb_acc x) { return (fb_acc)1 / x; }
#endif
FB_HD float fb_sigmoid(float x) { return fb_div(1.0f, 1.0f + fb_exp(-x)); }
FB_HD float fb_clamp01(float x) { return x < 0.0f ? 0.0f : (x > 1.0f ? 1.0f : x); }  // NaN stays NaN
#ifdef __CUDACC__
FB_HD float fb_round_bf16(float x) { return __bfloat162float(__float2bfloat16_rn(x)); }
FB_HD float fb_round_fp16(float x) { return __half2float(__float2half_rn(x)); }
#else
FB_HD float fb_round_bf16(float x) { return (float)fb_bf16(x); }
FB_HD float fb_round_fp16(float x) { return (float)(_Float16)x; }
#endif
#ifdef __CUDACC__
FB_HD float fb_rsqrt(float x) { return rsqrtf(x); }
#else
FB_HD float fb_rsqrt(float x) { return 1.0f / sqrtf(x); }
#endif
"""
