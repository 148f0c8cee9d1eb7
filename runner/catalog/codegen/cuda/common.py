"""Helpers every CUDA layout shares: element types, element, vector and gathered loads (`Loads`, `emitter`), rowblock
and row-vector indexing, the host's test for the V-wide kernels, the stores of outputs after the first (`More`), a
library workspace and the exported entry point."""

from __future__ import annotations

from runner.catalog.codegen.common import (
    CTYPE_CUDA,
    AccRef,
    Emitter,
    NotExpressible,
    counter_iota,
    counter_spans,
    index_code,
    integer_inputs,
)
from runner.catalog.ir import Program


def ctype_of(dtype: str) -> str:
    if dtype not in CTYPE_CUDA:
        raise NotExpressible(f"dtype {dtype}")
    return CTYPE_CUDA[dtype]


class Loads:
    """Element loads: vector registers for inputs read V-wide, indexed loads for the rest."""

    def __init__(self, p: Program, vec_inputs: set[int], runs: bool = True):
        self.p, self.vec = p, vec_inputs
        self.spans = counter_spans(p)  # the dims o, r, i count (a strided view's index and an Iota from them)
        # with vectors, a rowblock input is one value per vector (the host checks that its runs are whole vectors),
        # or, where it was captured with runs of one element (its dims all vary inside the row), a vector of its own;
        # `runs` False: the vectors go across columns, and a rowblock input is one value per reduced index
        self.blk = set(rowblock_inputs(p)) if vec_inputs else set()
        self.blk_vec = {k for k in self.blk if runs and p.block_len(k) == 1}
        self.used: set[int] = set()  # vector (and rowblock) inputs the code emitted since the last clear() reads

    def __call__(self, k: int) -> str:
        if k in self.vec:
            self.used.add(k)
            return f"fb_f(v{k}.v[j])"
        if k in self.blk:
            self.used.add(k)
            return f"fb_f(b{k}.v[j])" if k in self.blk_vec else f"fb_f(b{k})"
        return f"fb_f(((const {ctype_of(self.p.inputs[k].dtype)}*)a.in[{k}])[{index_code(self.p, k, self.spans)}])"

    def gather(self, k: int, extra: str) -> str:
        """Input k read `extra` elements past its element at the current position (a Gather), one element."""
        return f"fb_f(((const {ctype_of(self.p.inputs[k].dtype)}*)a.in[{k}])[{index_code(self.p, k, self.spans)}{extra}])"

    def block_decls(self, r0: str, V: int) -> str:
        """The value of each rowblock input the code read for the vector at in-row position `r0` (rb{k}: its offset
        at the row's start, from row_bases), or its V values there where its runs are single elements."""
        out = []
        for k in sorted(self.blk & self.used):
            t = ctype_of(self.p.inputs[k].dtype)
            out.append(f"const FbVec<{t}, {V}> b{k} = fb_ldv<{t}, {V}>((const {t}*)a.in[{k}] + rb{k} + {r0});"
                       if k in self.blk_vec else f"const {t} b{k} = ((const {t}*)a.in[{k}])[rb{k} + fb_rbq(a, {k}, {r0})];")
        return " ".join(out)

    def vector_decls(self, base: str, V: int, row_base: str = "r0") -> str:
        """Vector loads at `base` (an input of the full shape) or at `row_base` (a row vector: it varies along the
        reduced dims only, e.g. a LayerNorm's weight, and is read at the same place for every row)."""
        out = []
        for k in sorted(self.vec & self.used):
            t = ctype_of(self.p.inputs[k].dtype)
            at = vector_at(self.p, k, base, row_base)
            out.append(f"const FbVec<{t}, {V}> v{k} = fb_ldv<{t}, {V}>((const {t}*)a.in[{k}] + {at});")
        if self.blk & self.used:
            out.append(self.block_decls(row_base, V))
        return "\n        ".join(out)


def emitter(loads) -> Emitter:
    """An Emitter over `loads` (a Loads, or a layout's own with the same two methods): loads, and Gathers."""
    p = getattr(loads, "p", None)
    if p is None:
        return Emitter(loads, gather=loads.gather)
    spans = getattr(loads, "spans", counter_spans(p))
    return Emitter(loads, gather=loads.gather, ints=integer_inputs(p),
                   iota=counter_iota(p, spans) if spans is not None else None)


def vector_at(p: Program, k: int, base: str, row_base: str) -> str:
    """Where input k's vector for the output vector at flat `base` / in-row `row_base` starts."""
    kind = p.access(k)
    return {"rowvec": row_base, "rowper": f"fb_rper(a, {k}, {row_base})"}.get(kind, base)


UNIT_RUNS = """
// rowblock runs of one element are read V-wide from each row's start: V divides every outer stride, the base aligns
static bool fb_unit_runs(const FbArgs& a, int k, int V, int esize) {
  if (a.bL[k] != 1 || !fb_aligned(a.in[k], V * esize)) return false;
  for (int d = 0; d < a.a0; ++d) if (a.st[k][d] % V) return false;
  return true;
}
"""


def rowblock_inputs(p: Program) -> list[int]:
    return [k for k in range(len(p.inputs)) if p.access(k) == "rowblock"]


def row_bases(p: Program) -> str:
    """Per row (after `o` is known): each rowblock input's offset at the row's start."""
    return " ".join(f"const long long rb{k} = fb_obase(a, {k}, o); (void)rb{k};" for k in rowblock_inputs(p))


def pass_feed(plan, loads: Loads, pno: int, indent: str) -> tuple[list, str]:
    """Pass `pno` of a row plan: its accumulators, and the loop body (lines joined at `indent`) that loads what they
    need and feeds them."""
    accs = [x for x in plan.accs if x.pass_no == pno]
    loads.used.clear()
    em = emitter(loads)
    adds = [f"{x.name}.add({em(x.arg)}, r);" for x in accs]
    return accs, indent.join(em.lines + adds)


def vec_inputs(p: Program, kinds: tuple[str, ...]) -> set[int]:
    return {k for k in range(len(p.inputs)) if p.access(k) in kinds}


def align_check(p: Program, vec_inputs: set[int], out_t: str, V: int, extra: str, runs: bool = True) -> str:
    """The host's test for the V-wide kernel: aligned pointers, `extra`, each rowper input's period whole vectors,
    and (`runs`: vectors along the row) each rowblock input's runs made of whole vectors."""
    conds = [f"fb_aligned(a.in[{k}], {V} * (int)sizeof({ctype_of(p.inputs[k].dtype)}))" for k in sorted(vec_inputs)]
    conds += [f"a.bL[{k}] % {V} == 0" for k in sorted(vec_inputs) if p.access(k) == "rowper"]  # no vector wraps
    for k in rowblock_inputs(p) if runs else []:
        if p.block_len(k) == 1:  # read V-wide from its offset at each row's start
            conds.append(f"fb_unit_runs(a, {k}, {V}, (int)sizeof({ctype_of(p.inputs[k].dtype)}))")
        else:
            conds.append(f"a.bL[{k}] % {V} == 0")
    conds.append(f"fb_aligned(a.out, {V} * (int)sizeof({out_t}))")
    conds += [f"fb_aligned(a.more[{j}], {V} * (int)sizeof({ctype_of(o.dtype)}))" for j, o in enumerate(p.more)]
    if extra:
        conds.append(extra)
    return " && ".join(conds)


def workspace_code(fields: str) -> str:
    """A library's device workspace: `struct FbWs { fields }` and fb_workspace(bytes, stream): the caller's scratch
    memory where it gave some (fusebot_set_workspace, runner/csrc/fusebot.h: per thread, used once), else one buffer
    grown on the caller's stream (never shrunk); 0, keeping nothing, when the allocation fails or what was given is
    too small (fusebot_workspace_need() then says how much)."""
    return f"""struct FbWs {{ {fields or 'int unused;'} }};
static void* fb_ws = 0;
static size_t fb_ws_bytes = 0;
static thread_local void* fb_given = 0;
static thread_local size_t fb_given_bytes = 0, fb_need = 0;
static thread_local int fb_given_set = 0;
FB_EXPORT void fusebot_set_workspace(void* p, size_t bytes) {{
  fb_given = p; fb_given_bytes = bytes; fb_given_set = 1; fb_need = 0;
}}
FB_EXPORT size_t fusebot_workspace_need(void) {{ return fb_need; }}
static void* fb_workspace(size_t need, cudaStream_t s) {{
  if (fb_given_set) {{ fb_given_set = 0; fb_need = need; return need <= fb_given_bytes ? fb_given : 0; }}
  if (need > fb_ws_bytes) {{
    if (fb_ws) cudaFreeAsync(fb_ws, s);
    fb_ws_bytes = 0;
    if (cudaMallocAsync(&fb_ws, need, s) != cudaSuccess) {{ fb_ws = 0; return 0; }}
    fb_ws_bytes = need;
  }}
  return fb_ws;
}}
"""


def forward(launch: str) -> str:
    return f"""
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {{
  FbArgs a;
  if (fb_setup(in, n_in, out, n_out, &a)) return 1;
  cudaStream_t s = (cudaStream_t)stream;
{launch}
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {{ snprintf(fb_err, sizeof fb_err, "launch: %s", cudaGetErrorString(e)); return 2; }}
  return 0;
}}
"""


def value_decls(plan, pno: int) -> str:
    return "\n    ".join(f"const {'long long' if v.is_int else 'float'} {v.name} = {v.code};"
                           for v in plan.values if v.pass_no == pno)


# ---- outputs after the first (Program.more): written beside output 0, by the same threads, in the same pass -----


class More:
    """The code of a program's outputs 1, 2, ... at a template's output point: `values(em, exprs)` first (their
    temporaries join em.lines before the template joins them), then, in a V-wide body, `decls(v)` before the lane
    loop, `sets()` inside it (lane j) and `stores(v, at)` after it; or `scalar_stores(at)` for one value each."""

    def __init__(self, p: Program):
        self.types = [ctype_of(o.dtype) for o in p.more]
        self.ints = [o.dtype in ("int64", "int32") for o in p.more]
        self.vals: list[str] = []

    def values(self, em: Emitter, exprs: list) -> None:
        vals = []
        for e, is_int in zip(exprs, self.ints, strict=True):
            if is_int and not isinstance(e, AccRef):
                raise NotExpressible("an integer output other than a reduction's index")
            vals.append(e.name if is_int else em(e))
        self.vals = vals

    def decls(self, v: int) -> str:
        return " ".join(f"FbVec<{t}, {v}> om{j};" for j, t in enumerate(self.types))

    def sets(self) -> str:
        return " ".join(f"om{j}.v[j] = fb_to<{t}>({x});" for j, (t, x) in enumerate(zip(self.types, self.vals, strict=True)))

    def stores(self, v: int, at: str) -> str:
        return " ".join(f"fb_stv<{t}, {v}>(({t}*)a.more[{j}] + {at}, om{j});" for j, t in enumerate(self.types))

    def scalar_stores(self, at: str) -> str:
        return " ".join(f"(({t}*)a.more[{j}])[{at}] = fb_to<{t}>({x});"
                        for j, (t, x) in enumerate(zip(self.types, self.vals, strict=True)))


def spaced(code: str) -> str:
    """`code` after a space, or nothing: an optional statement appended to a line of a template."""
    return f" {code}" if code else ""
