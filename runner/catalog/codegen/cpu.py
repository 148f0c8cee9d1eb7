"""C++ templates for the CPU backend (OpenMP, loops the compiler vectorises).

- `flat`: an elementwise program, one loop over the output (`omp parallel for simd`, or one thread for small sizes);
- `rows`: a row program, one row per iteration of an OpenMP loop, its passes as inner loops over the row;
- `columns`: a row program whose reduced dims are not innermost (I > 1): per outer index, accumulators for a whole
  row of inner elements, so the innermost loop runs over contiguous memory.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from runner.catalog.codegen.common import (
    CTYPE_CPU,
    AccRef,
    Emitter,
    NotExpressible,
    float_literal,
    full_output,
    index_code,
    integer_inputs,
    plan_passes,
    row_result,
    signature,
)
from runner.catalog.codegen.head import MATH, args_struct, setup_code
from runner.catalog.codegen.index import index_fns
from runner.catalog.codegen.used import accumulators
from runner.catalog.ir import Program, rebuild, totals
from runner.catalog.sizes import sizes_line


def _extra(p: Program, em: Emitter, exprs: list, index: str) -> list[str]:
    """Stores of outputs 1, 2, ... at `index` (their temporaries go to em.lines; output 0 is the template's)."""
    out = []
    for j, (o, e) in enumerate(zip(p.more, exprs, strict=True)):
        t = _ctype(o.dtype)
        out.append(f"(({t}*)a.more[{j}])[{index}] = ({t}){em(e)};")
    return out


@dataclass(frozen=True)
class CpuParams:
    layout: str = "rows"  # flat | rows | columns
    mode: str = "online"  # online | twopass (row programs)
    threads: str = "all"  # all | one (below 32k elements OpenMP costs more than it saves)
    fast_math: bool = False

    def label(self) -> str:
        return f"cpu-{self.layout}-{self.mode}-{self.threads}{'-fast' if self.fast_math else ''}"


PRELUDE = r"""#include "fusebot.h"
#include <math.h>
#include <stdio.h>
#include <vector>
#define FB_HD static inline
#define FB_M inline
#include <string.h>
typedef double fb_acc;
struct fb_bf16 {  // bf16 storage: widened exactly, narrowed to the nearest value (ties to even), NaN kept
  uint16_t v;
  fb_bf16() = default;
  fb_bf16(float f) {
    uint32_t u; memcpy(&u, &f, 4);
    v = (u & 0x7fffffffu) > 0x7f800000u ? (uint16_t)((u >> 16) | 0x40) : (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
  }
  operator float() const { uint32_t u = (uint32_t)v << 16; float f; memcpy(&f, &u, 4); return f; }
};
struct fb_f16 {  // fp16 storage through the compiler's _Float16 (round to nearest even)
  _Float16 v;
  fb_f16() = default;
  fb_f16(float f) : v((_Float16)f) {}
  operator float() const { return (float)v; }
};
"""


FAST = ("#define FB_FAST\n#define FB_FAST_EXP(x) expf(x)\n#define FB_FAST_DIV(x, y) ((x) * (1.0f / (y)))\n"
        "#define FB_FAST_LOG(x) logf(x)\n")


def _ctype(dtype: str) -> str:
    if dtype not in CTYPE_CPU:
        raise NotExpressible(f"{dtype} on the CPU backend")
    return CTYPE_CPU[dtype]


def _loader(p: Program):
    def load(k: int, extra: str = "") -> str:
        return f"(float)((const {_ctype(p.inputs[k].dtype)}*)a.in[{k}])[{index_code(p, k)}{extra}]"

    return load


def _em(p: Program, **kw) -> Emitter:
    load = _loader(p)
    return Emitter(load, gather=load, ints=integer_inputs(p), **kw)


def _omp(params: CpuParams, simd: bool = False) -> str:
    if params.threads == "one":
        return "#pragma omp simd" if simd else ""
    return "#pragma omp parallel for simd schedule(static)" if simd else "#pragma omp parallel for schedule(static)"


def render(p: Program, params: CpuParams, abi_offset: int = 0) -> str:
    """The C++ source of one candidate."""
    out_t = _ctype(p.out_dtype)
    for inp in p.inputs:
        _ctype(inp.dtype)
    head = [f"// fusebot catalog: {params.label()}", f"// {signature(p)}", sizes_line(p, abi_offset), PRELUDE]
    if params.fast_math:
        head.append(FAST)
    if params.layout == "flat":
        body = _flat(p, params, out_t)
    elif params.layout == "rows":
        body = _rows(p, params, out_t)
    elif params.layout == "columns":
        body = _columns(p, params, out_t)
    else:
        raise NotExpressible(f"layout {params.layout}")
    tail = """
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream;
  FbArgs a;
  if (fb_setup(in, n_in, out, n_out, &a)) return 1;
  fb_run(a);
  return 0;
}
"""
    setup = setup_code(p, abi_offset)
    used = setup + body  # only the accumulators and index functions these use
    head += [MATH, accumulators(used), args_struct(p), index_fns(used, p), setup]
    return "\n".join(head) + body + tail


def _flat(p: Program, params: CpuParams, out_t: str) -> str:
    if p.is_row:
        raise NotExpressible("flat is for elementwise programs")
    em = _em(p)
    res = em(p.out)
    stores = _extra(p, em, [o.expr for o in p.more], "flat")
    body = "\n      ".join(em.lines + stores)
    omp = _omp(params, simd=True)
    return f"""
static void fb_run(const FbArgs& a) {{
  {out_t}* y = ({out_t}*)a.out;
  const long long n = a.N;
  {omp}
  for (long long flat = 0; flat < n; ++flat) {{
      const long long o = flat, r = 0, i = 0; (void)o; (void)r; (void)i;
      {body}
      y[flat] = ({out_t}){res};
  }}
}}
"""


def _pass_code(p: Program, plan, pno: int, indent: str, ref, acc_ref) -> tuple[str, str]:
    """(declarations, loop body) of one pass: every accumulator of the pass fed from one loop."""
    accs = [a for a in plan.accs if a.pass_no == pno]
    em = _em(p, ref=ref)
    adds = []
    for a in accs:
        v = em(a.arg)
        adds.append(f"{acc_ref(a.name)}.add({v}, r);")
    body = ("\n" + indent).join(em.lines + adds)
    return body, ""


def _guard(p: Program) -> str:
    """Where a padding mask is 0 the element adds nothing (runner.catalog.skipping.find_guard): skip it unread."""
    if p.skip_zero is None:
        return ""
    return f"if ({_loader(p)(p.skip_zero)} == 0.0f) continue;  /* a padded element */"


def _rows(p: Program, params: CpuParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("rows is for row programs")
    plan = plan_passes(p, params.mode)
    ind = "        "
    parts = []
    for pno in range(1, plan.passes + 1):
        accs = [a for a in plan.accs if a.pass_no == pno]
        decl = " ".join(f"{a.kind} {a.name}; {a.name}.init();" for a in accs)
        body, _ = _pass_code(p, plan, pno, ind, lambda n: n, lambda n: n)
        vals = "\n      ".join(f"const {'long long' if v.is_int else 'float'} {v.name} = {v.code};"
                              for v in plan.values if v.pass_no == pno)
        parts.append(f"""      {decl}
      for (long long r = 0; r < lim; ++r) {{
        const long long flat = (o * a.R + r) * a.I + i; (void)flat;
        {_guard(p)}
        {body}
      }}
      {vals}""")
    if p.limit is not None:  # a causal mask: the row's limit from its own index (runner.catalog.skipping)
        le = _em(p, prefix="l")
        code = le(p.limit)
        lim_lines = "\n      ".join(le.lines)
        parts.insert(0, f"""      long long lim;
      {{ const long long r = 0, flat = o * a.R * a.I + i; (void)r; (void)flat;
      {lim_lines}
      lim = (long long){code}; lim = lim < 0 ? 0 : (lim > a.R ? a.R : lim); }}""")
    else:
        parts.insert(0, "      const long long lim = a.R;")
    em = _em(p)
    assert plan.out is not None
    pre = post = ""
    if p.has_totals:  # per-row values into a vector each, then their reductions in row order and the scalar
        tots = totals(plan.out)
        args = [em(t.arg) for t in tots]
        lines = "\n      ".join(em.lines + [f"tot{j}[row] = (double){x};" for j, x in enumerate(args)])
        out = f"""      {{ const long long r = 0, flat = o * a.R * a.I + i; (void)flat; (void)r;
      {lines} }}"""
        pre = "".join(f"  std::vector<double> tot{j}((size_t)rows);\n" for j in range(len(tots)))
        fin = _em(p)
        done = {t: AccRef(f"T{j}") for j, t in enumerate(tots)}
        res = fin(_replace(plan.out, done))
        red = []
        for j, t in enumerate(tots):
            step = {"sum": f"T{j} += tot{j}[k];",  # max and min: NaN where any is (torch.amax's)
                    "max": f"T{j} = (tot{j}[k] > T{j} || tot{j}[k] != tot{j}[k]) ? tot{j}[k] : T{j};",
                    "min": f"T{j} = (tot{j}[k] < T{j} || tot{j}[k] != tot{j}[k]) ? tot{j}[k] : T{j};"}[t.kind]
            red.append(f"  double T{j} = tot{j}[0]; for (long long k = 1; k < rows; ++k) {step}")
        post = "\n".join(red) + "\n  { const long long flat = 0, o = 0, r = 0, i = 0; (void)flat; (void)o; (void)r; " \
            "(void)i;\n    " + "\n    ".join(fin.lines) + f"\n    y[0] = ({out_t}){res}; }}\n"
    elif full_output(p):
        res = em(plan.out)
        stores = _extra(p, em, plan.more, "flat")
        lines = ("\n" + ind).join(em.lines + stores)
        out = f"""      for (long long r = 0; r < lim; ++r) {{
        const long long flat = (o * a.R + r) * a.I + i;
        {lines}
        y[flat] = ({out_t}){res};
      }}
      for (long long r = lim; r < a.R; ++r) y[(o * a.R + r) * a.I + i] = ({out_t}){float_literal(p.beyond)};"""
    else:
        res = row_result(p, plan, em)
        stores = _extra(p, em, plan.more, "row")
        lines = "\n      ".join(em.lines + stores)
        out = f"""      {{ const long long r = 0, flat = o * a.R * a.I + i; (void)flat; (void)r;
      {lines}
      y[row] = ({out_t}){res}; }}"""
    omp = _omp(params)
    passes = "\n".join(parts)
    return f"""
static void fb_run(const FbArgs& a) {{
  {out_t}* y = ({out_t}*)a.out;
  const long long rows = a.O * a.I;
{pre}  {omp}
  for (long long row = 0; row < rows; ++row) {{
      const long long o = row / a.I, i = row % a.I;
{passes}
{out}
  }}
{post}}}
"""


def _replace(e, done: dict):
    """e with each Total in `done` replaced by its finished value."""
    if e in done:
        return done[e]
    return rebuild(e, lambda c: _replace(c, done))


def per_column(code: str) -> str:
    """A finished value's code for column i: accumulators and earlier values are vectors over i."""
    code = re.sub(r"\b(acc\d+)\.", r"\1[i].", code)
    return re.sub(r"\b(rv\d+)\b", r"\1[i]", code)


def _columns(p: Program, params: CpuParams, out_t: str) -> str:
    if not p.is_row:
        raise NotExpressible("columns is for row programs")
    if p.has_totals:
        raise NotExpressible("a reduction over every row (rows layout)")
    plan = plan_passes(p, params.mode)
    ref = lambda n: f"{n}[i]"  # noqa: E731
    parts = []
    for pno in range(1, plan.passes + 1):
        accs = [a for a in plan.accs if a.pass_no == pno]
        decl = "\n      ".join(f"std::vector<{a.kind}> {a.name}(a.I); for (auto& z : {a.name}) z.init();"
                               for a in accs)
        body, _ = _pass_code(p, plan, pno, "          ", ref, lambda n: f"{n}[i]")
        vals = "\n      ".join(
            f"std::vector<{'long long' if v.is_int else 'float'}> {v.name}(a.I);\n"
            f"      for (long long i = 0; i < a.I; ++i) {v.name}[i] = {per_column(v.code)};"
            for v in plan.values if v.pass_no == pno)
        parts.append(f"""      {decl}
      for (long long r = 0; r < a.R; ++r) {{
        {{ const long long i = 0, flat = (o * a.R + r) * a.I; (void)i; (void)flat; {_guard(p)} }}
        for (long long i = 0; i < a.I; ++i) {{
          const long long flat = (o * a.R + r) * a.I + i; (void)flat;
          {body}
        }}
      }}
      {vals}""")
    em = _em(p, ref=ref)
    assert plan.out is not None
    if full_output(p):
        res = em(plan.out)
        stores = _extra(p, em, plan.more, "flat")
        lines = "\n          ".join(em.lines + stores)
        out = f"""      for (long long r = 0; r < a.R; ++r) {{
        for (long long i = 0; i < a.I; ++i) {{
          const long long flat = (o * a.R + r) * a.I + i;
          {lines}
          y[flat] = ({out_t}){res};
        }}
      }}"""
    else:
        res = row_result(p, plan, em)
        if isinstance(plan.out, AccRef):
            res = f"{plan.out.name}[i]"
        stores = _extra(p, em, plan.more, "o * a.I + i")
        lines = "\n        ".join(em.lines + stores)
        out = f"""      for (long long i = 0; i < a.I; ++i) {{
        const long long r = 0, flat = o * a.R * a.I + i; (void)flat; (void)r;
        {lines}
        y[o * a.I + i] = ({out_t}){res};
      }}"""
    omp = _omp(params)
    passes = "\n".join(parts)
    return f"""
static void fb_run(const FbArgs& a) {{
  {out_t}* y = ({out_t}*)a.out;
  {omp}
  for (long long o = 0; o < a.O; ++o) {{
{passes}
{out}
  }}
}}
"""
