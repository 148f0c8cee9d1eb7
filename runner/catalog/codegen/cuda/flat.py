"""CUDA templates for elementwise programs: `flat` and `bcast`.

- `flat`: each thread handles U vectors of V consecutive elements per step, each through one aligned vector access
  (V=2 halves is a half2 load, V=4 floats a float4), all U loaded before any is computed; grid-stride over one full
  wave of blocks, or one pass of the grid;
- `bcast`: `flat` for inputs broadcast along leading or trailing dims (a per-row scale `a[:, None]`, a bias
  `b[None, :]`, a per-channel `c[:, None, None]`): the output seen as [A, B, C], each input's index stepped forward
  from per-thread counters (no division per element), per-row values loaded once per vector."""

from __future__ import annotations

from dataclasses import dataclass

from runner.catalog.codegen.common import NotExpressible, index_code, stored
from runner.catalog.codegen.cuda.common import Loads, More, align_check, ctype_of, emitter, forward, spaced
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.ir import Iota, Program, walk


@dataclass(frozen=True)
class BroadcastView:
    """An elementwise program's output seen as [A, B, C], three consecutive runs of its dims, where every input either
    varies along a whole run or is broadcast along all of it: its element index is dA * sa + dB * sb + dC from the
    output's digits (dA, dB, dC) and its own strides, so a thread steps its digits forward and never divides.

    `seg`: each F dim's run (0 = A, 1 = B, 2 = C), -1 for a dim of size 1 at capture; `present`: per input, whether
    it varies along A, B, C (an input the output does not read: none). Two runs leave A empty (of size 1)."""

    seg: tuple[int, ...]
    present: tuple[tuple[bool, bool, bool], ...]
    sizes: tuple[int, int, int]  # A, B, C at capture

    @property
    def three(self) -> bool:
        return 0 in self.seg


def broadcast_view(p: Program) -> BroadcastView | None:
    """The [A, B, C] view of an elementwise program with a broadcast input (a per-row `a[:, None]`, a bias
    `b[None, :]`, a per-channel `c[:, None, None]` of an NCHW tensor); None without one, or when more than three runs
    of dims read differently, or with a strided view among the inputs (those take the general index path)."""
    used = p.used_inputs()
    if p.is_row or not any(p.access(k) == "general" for k in used) or any(p.access(k) == "strided" for k in used):
        return None
    runs: list[tuple[tuple[bool, ...], list[int]]] = []
    for d, f in enumerate(p.shape):
        if f == 1:
            continue
        mask = tuple(p.padded(k)[d] != 1 for k in used)
        if runs and runs[-1][0] == mask:
            runs[-1][1].append(d)
        else:
            runs.append((mask, [d]))
    if not 2 <= len(runs) <= 3:
        return None
    first = 3 - len(runs)
    seg, sizes = [-1] * p.ndim, [1, 1, 1]
    for r, (_, dims) in enumerate(runs):
        for d in dims:
            seg[d] = first + r
            sizes[first + r] *= p.shape[d]
    present = [(False, False, False)] * len(p.inputs)
    for n, k in enumerate(used):
        present[k] = tuple([False] * first + [m[n] for m, _ in runs])  # type: ignore[assignment]
    return BroadcastView(tuple(seg), tuple(present), (sizes[0], sizes[1], sizes[2]))


class _FlatLoads:
    """Element loads of the flat kernels, by how each input is read: `vec` (V elements in registers v{k}[u], filled
    by the load pass), `row` (one value per vector in w{k}[u]: an input broadcast along the view's last run),
    `scalar` (read once per thread into s{k}) or `general` (an index from the strides, per element)."""

    def __init__(self, p: Program, how: dict[int, str], spans: tuple[int, int] | None = None):
        self.p, self.how, self.spans = p, how, spans

    def __call__(self, k: int) -> str:
        h = self.how[k]
        if h == "vec":
            return f"fb_f(v{k}[u].v[j])"
        if h == "row":
            return f"fb_f(w{k}[u])"
        if h == "scalar":
            return f"s{k}"
        return f"fb_f(fb_ld1((const {ctype_of(self.p.inputs[k].dtype)}*)a.in[{k}] + {index_code(self.p, k, self.spans)}))"

    def gather(self, k: int, extra: str) -> str:
        at = index_code(self.p, k, self.spans)
        return f"fb_f(fb_ld1((const {ctype_of(self.p.inputs[k].dtype)}*)a.in[{k}] + {at}{extra}))"


def _bc_index(view: BroadcastView, k: int) -> str:
    pa, pb, pc = view.present[k]
    terms = ([f"dA * g.sa[{k}]"] if pa else []) + ([f"dB * g.sb[{k}]"] if pb else []) + (["dC"] if pc else [])
    return " + ".join(terms) or "0"


def _flat_kernel(p: Program, name: str, how: dict[int, str], V: int, T: int, U: int, out_t: str,
                 view: BroadcastView | None = None) -> str:
    """One flat kernel: per step a block covers T * U vectors of V elements; each thread loads its U vectors (and
    each vector's per-row values) first, then computes and stores them. `view`: a bcast kernel, whose broadcast
    inputs are indexed from the digits the thread steps forward (sizes and steps in FbBc g, set by the host)."""
    used = p.used_inputs()
    tu = T * U
    hoist, decls, loads = [], [], []
    for k in used:
        t = ctype_of(p.inputs[k].dtype)
        ptr = f"(const {t}*)a.in[{k}]"
        if how[k] == "scalar":
            hoist.append(f"const float s{k} = fb_f(fb_ld1({ptr}));")
        elif how[k] == "vec":
            at = f"q * {V}" if p.access(k) == "full" else _bc_index(view, k)  # type: ignore[arg-type]
            decls.append(f"FbVec<{t}, {V}> v{k}[{U}];")
            loads.append(f"v{k}[u] = fb_ldv<{t}, {V}>({ptr} + {at});")
        elif how[k] == "row":
            decls.append(f"{t} w{k}[{U}];")
            loads.append(f"w{k}[u] = fb_ld1({ptr} + {_bc_index(view, k)});")  # type: ignore[arg-type]
    # strided views and Iotas read from a vector's coordinates (o: the innermost row, r: along it), found once per
    # vector: the host runs this kernel only where rows are whole vectors (in_rows)
    spans = (p.ndim - 1, p.ndim) if view is None and in_rows(p, V) else None
    em = emitter(_FlatLoads(p, how, spans))
    res = em(stored(p.out, p.out_dtype))
    more = More(p)
    more.values(em, [o.expr for o in p.more])
    body = [f"const long long nv = a.N / {V};", f"const long long t0 = (long long)blockIdx.x * {tu};", *hoist]
    step: list[str] = []
    if view is not None:
        body += ["long long dA = 0, dB = 0, dC = 0; (void)dA;",
                 f"fb_bc_at(g, (t0 + threadIdx.x) * {V}, a.small, dA, dB, dC);"]
        step = [f"if (u < {U} - 1) fb_bc_step(g, dA, dB, dC, g.a1, g.b1, g.c1);",
                "else fb_bc_step(g, dA, dB, dC, g.a2, g.b2, g.c2);"]
    loop = list(decls)
    if loads or step:
        loop += ["#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{",
                 f"  const long long q = t + u * {T} + threadIdx.x;",
                 "  if (q < nv) {", *_indent("\n".join(loads), 4).split("\n"), "  }", *_indent("\n".join(step), 2).split("\n"),
                 "}"]
    compute = [f"const long long base = q * {V};", f"FbVec<{out_t}, {V}> ov;{spaced(more.decls(V))}", "#pragma unroll",
               *([f"const long long fo = fb_qF(a, {p.ndim - 1}, base), fr = base - fo * fb_Fd(a, {p.ndim - 1});"]
                 if spans else []),
               f"for (int j = 0; j < {V}; ++j) {{", "  const long long flat = base + j; (void)flat;",
               *(["  const long long o = fo, r = fr + j, i = 0; (void)o; (void)r; (void)i;"] if spans else []),
               *("  " + x for x in em.lines), f"  ov.v[j] = fb_to<{out_t}>({res});{spaced(more.sets())}", "}",
               f"fb_stv<{out_t}, {V}>(({out_t}*)a.out + base, ov);{spaced(more.stores(V, 'base'))}"]
    loop += ["#pragma unroll", f"for (int u = 0; u < {U}; ++u) {{", f"  const long long q = t + u * {T} + threadIdx.x;",
             "  if (q < nv) {", *("    " + x for x in compute), "  }", "}"]
    body += [f"for (long long t = t0; t < nv; t += (long long)gridDim.x * {tu}) {{", *("  " + x for x in loop), "}"]
    if V > 1 and view is None:  # (a bcast kernel is wide only when the rows are whole vectors: no tail)
        body += ["if (blockIdx.x == 0) {  // the last N % V elements",
                 f"  for (long long flat = nv * {V} + threadIdx.x; flat < a.N; flat += blockDim.x) {{",
                 "    const long long o = flat, r = 0, i = 0; (void)o; (void)r; (void)i;",
                 *("    " + x for x in _scalar_tail(p).split("\n")), "  }", "}"]
    body = [x.rstrip() for x in body if x.strip()]
    code = "\n".join("  " + x for x in body)
    sig = "FbArgs a" if view is None else "FbArgs a, FbBc g"
    return f"\n__global__ void __launch_bounds__({T}) {name}({sig}) {{\n{code}\n}}\n"


def in_rows(p: Program, V: int) -> bool:
    """Whether the V-wide flat kernel finds strided views, broadcast inputs and Iotas from a vector's coordinates in
    the innermost row: where it reads any, and the captured rows are whole vectors (elsewhere, where the host would
    then run the scalar kernel, each element's index comes from its flat position instead)."""
    return p.ndim > 0 and p.shape[-1] % V == 0 and (
        any(p.access(k) in ("strided", "general") for k in p.used_inputs())
        or any(isinstance(e, Iota) for o in p.outputs for e in walk(o.expr)))


def _flat_how(p: Program, view: BroadcastView | None) -> dict[int, str]:
    how = {}
    for k in range(len(p.inputs)):
        acc = p.access(k)
        if acc in ("full", "scalar"):
            how[k] = "vec" if acc == "full" else "scalar"
        elif view is None:
            how[k] = "general"
        else:
            how[k] = "vec" if view.present[k][2] else "row"
    return how


def _indent(text: str, n: int) -> str:
    return "\n".join((" " * n + x) if x else x for x in text.split("\n"))


def _launch(kernel: str, V: int, T: int, U: int, grid: str, args: str = "a", prep: str = "") -> str:
    """Host code launching `kernel` over nv = a.N / V vectors, T * U per block: one pass of the grid, or (stride) at
    most one full wave of resident blocks, from the occupancy the compiled kernel reaches."""
    out = [f"long long blocks = (a.N / {V} + {T * U - 1}) / {T * U};"]
    if grid == "stride":
        out.append(f"{{ static const long long wave = fb_wave({kernel}, {T}); if (blocks > wave) blocks = wave; }}")
    out.append("if (blocks < 1) blocks = 1;")
    if prep:
        out.append(prep)
    out.append(f"{kernel}<<<(unsigned)blocks, {T}, 0, s>>>({args});")
    return "\n".join(out)


def _either(cond: str, then: str, other: str) -> str:
    return f"if ({cond}) {{\n{_indent(then, 2)}\n}} else {{\n{_indent(other, 2)}\n}}"


def render_flat(p: Program, params: CudaParams, out_t: str) -> str:
    if p.is_row:
        raise NotExpressible("flat is for elementwise programs")
    if params.unroll not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {params.unroll}")
    V, T, U = params.vec, params.threads, params.unroll
    how = _flat_how(p, None)
    kernels = [_flat_kernel(p, f"fb_flat_v{v}", how, v, T, U, out_t) for v in sorted({1, V})]
    launch = "if (a.N == 0) return 0;\n" + _flat_launch(p, how, V, T, U, params.grid, out_t)
    return "".join(kernels) + forward(_indent(launch, 2))


def _flat_launch(p: Program, how: dict[int, str], V: int, T: int, U: int, grid: str, out_t: str) -> str:
    narrow = _launch("fb_flat_v1", 1, T, U, grid)
    if V == 1:
        return narrow
    vec_in = {k for k in p.used_inputs() if how[k] == "vec"}
    rows = f"a.F[{p.ndim - 1}] % {V} == 0" if in_rows(p, V) else ""  # (a vector never crosses an innermost row)
    return _either(align_check(p, vec_in, out_t, V, rows), _launch(f"fb_flat_v{V}", V, T, U, grid), narrow)


def _bcast_support(p: Program, view: BroadcastView) -> str:
    """FbBc, the device helpers that find and step a thread's digits, and the host check that the run-time shapes
    read as the captured view (otherwise the general flat kernels run)."""
    n, nd = max(len(p.inputs), 1), max(p.ndim, 1)
    used = p.used_inputs()
    seg = ", ".join(str(x) for x in view.seg) or "-1"
    pres = ", ".join("{" + ", ".join("true" if x else "false" for x in view.present[k]) + "}"
                     for k in range(len(p.inputs))) or "{false, false, false}"
    if view.three:
        dev_at = """if (small) {
    const unsigned x = (unsigned)f, c = (unsigned)g.C, b = (unsigned)g.B, r = x / c, q = r / b;
    dC = x - r * c; dB = r - q * b; dA = q;
  } else {
    const long long r = f / g.C; dC = f - r * g.C; dB = r % g.B; dA = r / g.B;
  }"""
        dev_step = ("dC += sC; if (dC >= g.C) { dC -= g.C; ++dB; }\n  dB += sB; if (dB >= g.B) { dB -= g.B; ++dA; }\n"
                    "  dA += sA;")
        host_split = "C = n % g.C; n /= g.C; B = n % g.B; A = n / g.B;"
    else:  # A is empty: dA stays 0
        dev_at = """if (small) { const unsigned x = (unsigned)f, c = (unsigned)g.C, r = x / c; dC = x - r * c; dB = r; }
  else { const long long r = f / g.C; dC = f - r * g.C; dB = r; }"""
        dev_step = "dC += sC; if (dC >= g.C) { dC -= g.C; ++dB; }\n  dB += sB; (void)sA; (void)dA;"
        host_split = "C = n % g.C; B = n / g.C; A = 0;"
    checks = "\n".join(f"    if ((a.st[{k}][d] != 0) != pres[{k}][s]) return false;" for k in used)
    return f"""
struct FbBc {{
  long long A, B, C;                // the output as [A, B, C]
  long long sa[{n}], sb[{n}];        // each input's stride of dA and dB (0 where it is broadcast); dC's is 1 or 0
  long long a1, b1, c1;             // the digits of a step from one of a thread's vectors to the next
  long long a2, b2, c2;             // and from its last vector of a tile to its first of the next tile
}};
static bool fb_bc_view(const FbArgs& a, FbBc& g) {{
  static const int seg[{nd}] = {{{seg}}};
  static const bool pres[{n}][3] = {{{pres}}};
  long long S[3] = {{1, 1, 1}};
  for (int d = 0; d < {p.ndim}; ++d) {{
    if (a.F[d] == 1) continue;
    const int s = seg[d];
    if (s < 0) return false;
    S[s] *= a.F[d];
{checks}
  }}
  g.A = S[0]; g.B = S[1]; g.C = S[2];
  for (int k = 0; k < {len(p.inputs)}; ++k) {{
    g.sa[k] = pres[k][0] ? (pres[k][1] ? S[1] : 1) * (pres[k][2] ? S[2] : 1) : 0;
    g.sb[k] = pres[k][1] ? (pres[k][2] ? S[2] : 1) : 0;
  }}
  return true;
}}
static void fb_bc_split(const FbBc& g, long long n, long long& A, long long& B, long long& C) {{ {host_split} }}
static __device__ __forceinline__ void fb_bc_at(const FbBc& g, long long f, int small, long long& dA, long long& dB,
                                                long long& dC) {{
  {dev_at}
}}
static __device__ __forceinline__ void fb_bc_step(const FbBc& g, long long& dA, long long& dB, long long& dC,
                                                  long long sA, long long sB, long long sC) {{
  {dev_step}
}}
"""


def render_bcast(p: Program, params: CudaParams, out_t: str) -> str:
    view = broadcast_view(p)
    if view is None:
        raise NotExpressible("bcast is for elementwise programs whose inputs broadcast along at most three runs of dims")
    if params.unroll not in (1, 2, 4, 8):
        raise NotExpressible(f"unroll {params.unroll}")
    V, T, U = params.vec, params.threads, params.unroll
    how, flat_how = _flat_how(p, view), _flat_how(p, None)
    kernels = [_bcast_support(p, view)]
    kernels += [_flat_kernel(p, f"fb_bc_v{v}", how, v, T, U, out_t, view) for v in sorted({1, V})]
    # the general path is the fall-back for shapes the view does not fit: one vector per thread per step (unrolled,
    # its per-element index divisions make the source several times slower to compile)
    kernels += [_flat_kernel(p, f"fb_flat_v{v}", flat_how, v, T, 1, out_t) for v in sorted({1, V})]

    def bc_launch(v: int) -> str:  # the steps between a thread's vectors depend on the grid: set here
        steps = (f"fb_bc_split(g, {T * v}LL, g.a1, g.b1, g.c1);\n"
                 f"fb_bc_split(g, blocks * {T * U * v}LL - {(U - 1) * T * v}LL, g.a2, g.b2, g.c2);")
        return _launch(f"fb_bc_v{v}", v, T, U, params.grid, "a, g", steps)

    bc = bc_launch(1)
    if V > 1:  # wide when every row is whole vectors (then so is every inner input's row) and the pointers align
        vec_in = {k for k in p.used_inputs() if how[k] == "vec"}
        bc = _either(align_check(p, vec_in, out_t, V, f"g.C % {V} == 0"), bc_launch(V), bc)
    launch = "\n".join(["if (a.N == 0) return 0;", "FbBc g;",
                        _either("fb_bc_view(a, g)", bc, "// the run-time shapes broadcast otherwise: the general "
                                "index path\n" + _flat_launch(p, flat_how, V, T, 1, params.grid, out_t))])
    return "".join(kernels) + forward(_indent(launch, 2))


def _scalar_tail(p: Program) -> str:
    out_t = ctype_of(p.out_dtype)
    em = emitter(Loads(p, set()))
    res = em(stored(p.out, p.out_dtype))
    more = More(p)
    more.values(em, [o.expr for o in p.more])
    return "\n".join([*em.lines, f"(({out_t}*)a.out)[flat] = fb_to<{out_t}>({res});{spaced(more.scalar_stores('flat'))}"])
