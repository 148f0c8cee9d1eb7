"""Reductions over every row (ir.Total: a mean of per-row losses) for the layouts that finish a row in one block or
warp (`rows`, `regs`): each row's kernel stores the per-row value of every Total's argument in a workspace, then one
block of 1024 threads reduces them in a fixed order (thread t takes rows t, t + 1024, ... in turn, then a fixed tree)
and writes the program's single output. The result does not depend on the grid the rows ran on."""

from __future__ import annotations

from runner.catalog.codegen.common import AccRef, NotExpressible
from runner.catalog.codegen.cuda.common import Loads, emitter, workspace_code
from runner.catalog.ir import Expr, Program, rebuild, totals

ACC = {"sum": ("AccSum", "s"), "max": ("AccMax", "m"), "min": ("AccMin", "m")}
THREADS = 1024


def _swap(e: Expr, done: dict[Expr, Expr]) -> Expr:
    if e in done:
        return done[e]
    return rebuild(e, lambda c: _swap(c, done))


class Totals:
    """The Totals of a row plan's output (none: every method returns nothing, the layout's code is unchanged)."""

    def __init__(self, p: Program, plan):
        self.p, self.plan = p, plan
        self.list = totals(plan.out) if plan.out is not None else []
        for t in self.list:
            if t.kind not in ACC:
                raise NotExpressible(f"a {t.kind} over every row")

    def __bool__(self) -> bool:
        return bool(self.list)

    def param(self) -> str:
        return ", float* fb_tot" if self else ""

    def arg(self) -> str:
        return ", fb_tot" if self else ""

    def row_stores(self, em) -> list[str]:
        """Lines (after em's own) storing each Total's argument for row `row` of `a.O * a.I`."""
        vals = [em(t.arg) for t in self.list]
        return [f"fb_tot[{k}LL * a.O * a.I + row] = {v};" for k, v in enumerate(vals)]

    def support(self, out_t: str) -> str:
        """The workspace and the finishing kernel."""
        if not self:
            return ""
        accs = []
        for k, t in enumerate(self.list):
            kind, _ = ACC[t.kind]
            accs.append(f"{kind} tot{k}; tot{k}.init();\n"
                        f"  for (long long q = threadIdx.x; q < rows; q += {THREADS}) tot{k}.add(fb_tot[{k}LL * rows + q], q);\n"
                        f"  fb_block_reduce<{kind}, {THREADS}>(tot{k});")
        em = emitter(Loads(self.p, set()))
        done: dict[Expr, Expr] = {t: AccRef(f"(float)tot{k}.{ACC[t.kind][1]}") for k, t in enumerate(self.list)}
        res = em(_swap(self.plan.out, done))
        lines = "\n    ".join(em.lines)
        acc_code = "\n  ".join(accs)
        return workspace_code("float v;") + f"""
// every row's values reduced in a fixed order by one block, then the program's one output
__global__ void __launch_bounds__({THREADS}) fb_totals(FbArgs a, const float* fb_tot) {{
  const long long rows = a.O * a.I;
  {acc_code}
  if (threadIdx.x == 0) {{
    const long long o = 0, i = 0, r = 0, flat = 0; (void)o; (void)i; (void)r; (void)flat;
    {lines}
    (({out_t}*)a.out)[0] = fb_to<{out_t}>({res});
  }}
}}
"""

    def prepare(self) -> str:
        """Host code before the row kernel: the workspace of per-row values."""
        if not self:
            return ""
        n = len(self.list)
        return (f"  float* fb_tot = (float*)fb_workspace((size_t)(a.O * a.I) * {n} * sizeof(float), s);\n"
                "  if (!fb_tot) { snprintf(fb_err, sizeof fb_err, \"workspace allocation failed\"); return 3; }\n")

    def finish(self) -> str:
        """Host code after the row kernel: the finishing kernel."""
        return f"\n  fb_totals<<<1, {THREADS}, 0, s>>>(a, fb_tot);" if self else ""

