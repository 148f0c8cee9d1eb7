"""CUDA template `rope`: a rotary position embedding (runner.catalog.rope.Rope) over every output in one launch.

A thread owns one vector of V features of one row (a head of one token) and writes it in every output (q and k
where the module rotates both), so cos and sin are loaded once for all of them:

- half (rotate_half): the vector at j < rot / 2 and its partner at j + rot / 2, two V-wide loads of x at one offset,
  and of cos and sin at j and at j + rot / 2; out[j] = x[j] cos[j] - x[j+h] sin[j], out[j+h] = x[j+h] cos[j+h] +
  x[j] sin[j+h];
- pairs (GPT-J's rotate_every_two): V consecutive features, V / 2 pairs; a table repeated element by element
  (repeat_interleave) is read V / 2 wide;
- the features past rot: a plain V-wide copy.

Every size is the captured one (constants: a row's coordinates for the tables by multiplications, no division
instruction); bf16/fp16 products and sums are rounded where the reference rounds them. A V-wide kernel runs where
every pointer is aligned to its access, else the narrowest one (V = 1, or 2 for pairs).
"""

from __future__ import annotations

from math import prod

from runner.catalog.codegen.common import NotExpressible, signature
from runner.catalog.codegen.cuda.common import ctype_of
from runner.catalog.codegen.cuda.params import CudaParams
from runner.catalog.codegen.cuda.prelude import PRELUDE
from runner.catalog.codegen.head import DTYPE_CODE, MATH
from runner.catalog.ir import Program
from runner.catalog.rope import Rope, Table

ROUND = {"bfloat16": "fb_round_bf16", "float16": "fb_round_fp16"}


def units(r: Rope, V: int) -> tuple[int, int]:
    """(vectors per row that rotate, vectors per row passed through) at width V; NotExpressible where a row is not
    whole vectors."""
    rotating = r.rot // 2 if r.style == "half" else r.rot
    rest = r.head - r.rot
    if rotating % V or rest % V or (r.style == "pairs" and V % 2):
        raise NotExpressible(f"rotary rows of {rotating} + {rest} features are not whole vectors of {V}")
    return rotating // V, rest // V


def widths(p: Program) -> list[int]:
    """The vector widths the template serves for the program, widest first (16 bytes at most)."""
    r = p.rope
    if r is None:
        return []
    most = 16 // _size(r.dtype)
    out = []
    for v in (8, 4, 2, 1):
        try:
            if v <= most:
                units(r, v)
                out.append(v)
        except NotExpressible:
            pass
    return out


def _slots(r: Rope) -> dict[int, int]:
    """ABI position -> its slot in FbRope's `in` (every tensor the embedding reads, in order)."""
    return {abi: k for k, (abi, _, _) in enumerate(r.tensors)}


def _dtype(r: Rope, abi: int) -> str:
    return next(d for a, _, d in r.tensors if a == abi)


def head_dim(r: Rope) -> int | None:
    """The row dim both tables are broadcast along (the heads: q and k of one token share cos and sin), where every
    output spans it; None without one."""
    dims = [d for d in range(len(r.cos.strides)) if not r.cos.strides[d] and not r.sin.strides[d]
            and all(s[d] > 1 for s in r.shapes)]
    return dims[0] if len(dims) == 1 else None


def heads_per_thread(r: Rope, H: int) -> None:
    """NotExpressible where a thread cannot take H heads of each row (H must divide every output's head count)."""
    if H == 1:
        return
    d = head_dim(r)
    if d is None or any(s[d] % H for s in r.shapes):
        raise NotExpressible(f"{H} heads a thread: the tables do not broadcast along one dim of a multiple of {H}")


def heads_fit(r: Rope, H: int) -> bool:
    try:
        heads_per_thread(r, H)
        return True
    except NotExpressible:
        return False


def _row_offset(shape: tuple[int, ...], t: Table, row: str) -> str:
    """The table's row offset (elements) from a row number of an output of this shape (constants: no division)."""
    dims = shape[:-1]
    terms = []
    for d, st in enumerate(t.strides):
        if not st:
            continue
        inner = prod(dims[d + 1:])
        c = f"({row} / {inner}u)" if inner > 1 else row
        if d > 0:
            c = f"({c} % {dims[d]}u)"
        terms.append(f"(long long){c} * {st}LL")
    return " + ".join(terms) or "0LL"


def _segment(r: Rope, outs: list[int], V: int, rnd: str, H: int = 1) -> list[str]:
    """The work of one thread on row `row` (and the H - 1 rows of the next heads of its token, `step` rows apart:
    cos and sin loaded once for all), vector `u`, for the outputs `outs` (all of one shape)."""
    slot = _slots(r)
    xt, ct, st = ctype_of(r.dtype), ctype_of(_dtype(r, r.cos.abi)), ctype_of(_dtype(r, r.sin.abi))
    shape = r.shapes[outs[0]]
    UR, UP = units(r, V)
    D, h = r.head, r.rot // 2

    def out_ptr(o: int) -> str:
        return f"(({xt}*)a.out[{o}])"

    def x_ptr(o: int) -> str:
        return f"((const {xt}*)a.in[{slot[r.xs[o]]}])"

    d = head_dim(r)
    step = prod(shape[d + 1:-1]) if H > 1 and d is not None else 0

    def heads(body: list[str]) -> list[str]:
        """body for each of the thread's heads (its `base`: the head's row start)."""
        if H == 1:
            return [f"{{ const long long base = (long long)row * {D}LL;", *("  " + x for x in body), "}"]
        return ["#pragma unroll", f"for (int k = 0; k < {H}; ++k) {{",
                f"  const long long base = (long long)(row + (unsigned)k * {step}u) * {D}LL;",
                *("  " + x for x in body), "}"]

    lines = []
    if UP:
        lines.append(f"if (u >= {UR}u) {{  // the features past the rotated ones: a copy")
        lines += ["  " + x for x in heads(
            [f"const long long at = base + {r.rot} + (long long)(u - {UR}u) * {V};",
             *(f"fb_stv<{xt}, {V}>({out_ptr(o)} + at, fb_ldv<{xt}, {V}>({x_ptr(o)} + at));" for o in outs)])]
        lines += ["  return;", "}"]
    lines.append(f"const int j = (int)u * {V};")
    gathered: dict[tuple, str] = {}  # one load of a row's index for every table it gathers

    def table(name: str, t: Table, ty: str, col: str) -> list[str]:
        ptr = f"(const {ty}*)a.in[{slot[t.abi]}]"
        pre = []
        if t.index is not None:
            key = (t.index, t.strides, t.width)
            if key not in gathered:
                it = ctype_of(_dtype(r, t.index))
                gathered[key] = f"trow{len(gathered)}"
                pre = [f"const long long {gathered[key]} = (long long)fb_ld1((const {it}*)a.in[{slot[t.index]}] + "
                       f"{_row_offset(shape, t, 'row')}) * {t.width}LL;"]
            off = gathered[key]
        else:
            off = _row_offset(shape, t, "row")
        n = V // 2 if t.interleave else V
        at = f"({col}) / 2" if t.interleave else f"({col})"
        return [*pre, f"float {name}[{V}];",
                f"{{ const FbVec<{ty}, {n}> w = fb_ldv<{ty}, {n}>({ptr} + {off} + {t.col} + {at});",
                "#pragma unroll",
                f"  for (int l = 0; l < {V}; ++l) {name}[l] = fb_f(w.v[{'l / 2' if t.interleave else 'l'}]); }}"]

    if r.style == "half":
        if r.cos.interleave or r.sin.interleave:
            raise NotExpressible("a rotate_half embedding with tables repeated element by element")
        lines += table("c0", r.cos, ct, "j") + table("c1", r.cos, ct, f"j + {h}")
        lines += table("s0", r.sin, st, "j") + table("s1", r.sin, st, f"j + {h}")
        for o in outs:
            lines += heads([
                f"  const FbVec<{xt}, {V}> x0 = fb_ldv<{xt}, {V}>({x_ptr(o)} + base + j);",
                f"  const FbVec<{xt}, {V}> x1 = fb_ldv<{xt}, {V}>({x_ptr(o)} + base + j + {h});",
                f"  FbVec<{xt}, {V}> y0, y1;",
                "#pragma unroll",
                f"  for (int l = 0; l < {V}; ++l) {{",
                "    const float a0 = fb_f(x0.v[l]), a1 = fb_f(x1.v[l]);",
                f"    y0.v[l] = fb_to<{xt}>({rnd}({rnd}(a0 * c0[l]) + {rnd}(-a1 * s0[l])));",
                f"    y1.v[l] = fb_to<{xt}>({rnd}({rnd}(a1 * c1[l]) + {rnd}(a0 * s1[l])));",
                "  }",
                f"  fb_stv<{xt}, {V}>({out_ptr(o)} + base + j, y0);",
                f"  fb_stv<{xt}, {V}>({out_ptr(o)} + base + j + {h}, y1);"])
    else:
        lines += table("c", r.cos, ct, "j") + table("s", r.sin, st, "j")
        for o in outs:
            lines += heads([
                f"  const FbVec<{xt}, {V}> x = fb_ldv<{xt}, {V}>({x_ptr(o)} + base + j);",
                f"  FbVec<{xt}, {V}> y;",
                "#pragma unroll",
                f"  for (int l = 0; l < {V}; l += 2) {{",
                "    const float e = fb_f(x.v[l]), d = fb_f(x.v[l + 1]);",
                f"    y.v[l] = fb_to<{xt}>({rnd}({rnd}(e * c[l]) + {rnd}(-d * s[l])));",
                f"    y.v[l + 1] = fb_to<{xt}>({rnd}({rnd}(d * c[l + 1]) + {rnd}(e * s[l + 1])));",
                "  }",
                f"  fb_stv<{xt}, {V}>({out_ptr(o)} + base + j, y);"])
    return lines


def _groups(r: Rope) -> list[list[int]]:
    """Outputs written by the same threads: all of them where they have one shape (cos and sin loaded once for
    all), else one segment of the grid each (Llama's query heads, then its key-value heads)."""
    return [list(range(len(r.xs)))] if r.one_shape else [[o] for o in range(len(r.xs))]


def _threads(r: Rope, V: int, H: int = 1) -> int:
    return sum(r.rows(g[0]) // H * sum(units(r, V)) for g in _groups(r))


def _first_row(r: Rope, o: int, H: int) -> str:
    """The row of a thread's first head from its number `rr` among the rows / H (constants: no division)."""
    if H == 1:
        return "rr"
    shape = r.shapes[o]
    d = head_dim(r)
    assert d is not None
    inner, heads = prod(shape[d + 1:-1]), shape[d]
    return (f"(rr / {inner * heads // H}u) * {inner * heads}u + ((rr / {inner}u) % {heads // H}u) * {H * inner}u + "
            f"rr % {inner}u")


def _kernel(r: Rope, V: int, T: int, rnd: str, H: int = 1) -> str:
    U = sum(units(r, V))
    lines = [f"const unsigned tid = blockIdx.x * {T}u + threadIdx.x;", f"if (tid >= {_threads(r, V, H)}u) return;"]
    start = 0
    groups = _groups(r)
    for n, g in enumerate(groups):
        end = start + r.rows(g[0]) // H * U
        body = [f"const unsigned t = tid - {start}u, rr = t / {U}u, u = t - rr * {U}u;",
                f"const unsigned row = {_first_row(r, g[0], H)};", *_segment(r, g, V, rnd, H)]
        if len(groups) == 1:
            lines += body
        else:
            lines += [f"if (tid < {end}u) {{" if n == 0 else f"}} else if (tid < {end}u) {{" if n < len(groups) - 1
                      else "} else {", *("  " + x for x in body)]
        start = end
    if len(groups) > 1:
        lines.append("}")
    text = "\n".join("  " + x for x in "\n".join(lines).split("\n"))
    return f"\n__global__ void __launch_bounds__({T}) fb_rope_v{V}(FbRope a) {{\n{text}\n}}\n"


def _setup(r: Rope, abi_offset: int) -> tuple[str, str]:
    """The sizes line and fb_setup: every tensor the kernel reads has its captured shape and dtype, contiguous; each
    output its x's size and dtype."""
    sizes, checks = [], []
    for k, (abi, S, dtype) in enumerate(r.tensors):
        pos = abi + abi_offset
        sizes.append((pos, f"in{pos}={','.join(str(x) for x in S) or 'scalar'}"))
        dims = "".join(f" || t.shape[{j}] != {s}" for j, s in enumerate(S))
        checks += [f"  if (n_in <= {pos}) return fb_fail(\"too few inputs\");",
                   f"  {{ const fb_tensor& t = in[{pos}]; long long want = 1;",
                   f"    if (t.dtype != {DTYPE_CODE.get(dtype, -1)}) return fb_fail(\"input {pos}: expected {dtype}\");",
                   f"    if (t.ndim != {len(S)}{dims}) return fb_fail(\"input {pos}: size differs from the captured one"
                   "\");",
                   "    for (int d = t.ndim - 1; d >= 0; --d) { if (t.shape[d] != 1 && t.strides[d] != want) "
                   f"return fb_fail(\"input {pos} is not contiguous\"); want *= t.shape[d]; }}",
                   f"    a.in[{k}] = t.data; }}"]
    for o, shape in enumerate(r.shapes):
        checks += [f"  {{ long long n = 1; for (int d = 0; d < out[{o}].ndim; ++d) n *= out[{o}].shape[d];",
                   f"    if (n != {prod(shape)}LL) return fb_fail(\"output {o}: size differs from its input's\"); }}",
                   f"  if (out[{o}].dtype != {DTYPE_CODE.get(r.dtype, -1)}) return fb_fail(\"output {o}: dtype\");",
                   f"  a.out[{o}] = out[{o}].data;"]
    setup = "\n".join([
        "static char fb_err[512];",
        "FB_EXPORT const char* fusebot_last_error(void) { return fb_err; }",
        "static int fb_fail(const char* msg) { snprintf(fb_err, sizeof fb_err, \"%s\", msg); return 1; }",
        f"struct FbRope {{ const void* in[{len(r.tensors)}]; void* out[{len(r.xs)}]; }};",
        "static int fb_setup(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, FbRope* ap) {",
        "  FbRope& a = *ap;",
        f"  if (n_out != {len(r.xs)}) return fb_fail(\"expected {len(r.xs)} outputs\");",
        *checks, "  return 0;", "}"])
    return "// fusebot-sizes: " + " ".join(x for _, x in sorted(sizes)), setup


def render_rope(p: Program, params: CudaParams, abi_offset: int = 0) -> str:
    r = p.rope
    if r is None or p.is_row:
        raise NotExpressible("rope is for the rotary embeddings runner.catalog.rope recognises")
    if p.out_dtype != r.dtype:
        raise NotExpressible("a rotary embedding whose output dtype is not its input's")
    V, T = params.vec, params.threads
    low = 2 if r.style == "pairs" else 1
    if low > V:
        raise NotExpressible("pairs need an even vector width")
    units(r, V)
    H = params.unroll  # heads a thread (their rows share cos and sin)
    heads_per_thread(r, H)
    if _threads(r, low) >= 1 << 31:
        raise NotExpressible("2^31 vectors or more: the template's thread ids are 32-bit")
    rnd = ROUND.get(r.dtype, "")
    line, setup = _setup(r, abi_offset)
    kernels = "".join(_kernel(r, v, T, rnd, H) for v in sorted({low, V}))

    def launch(v: int) -> str:
        return f"fb_rope_v{v}<<<{(_threads(r, v, H) + T - 1) // T}, {T}, 0, s>>>(a);"

    ptrs = [f"fb_aligned(a.in[{k}], {V * _size(d)})" for k, (_, _, d) in enumerate(r.tensors) if d != "int64"]
    ptrs += [f"fb_aligned(a.out[{o}], {V * _size(r.dtype)})" for o in range(len(r.xs))]
    body = launch(V) if low == V else \
        f"if ({' && '.join(ptrs)}) {{\n    {launch(V)}\n  }} else {{\n    {launch(low)}\n  }}"
    fwd = f"""
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {{
  FbRope a;
  if (fb_setup(in, n_in, out, n_out, &a)) return 1;
  cudaStream_t s = (cudaStream_t)stream;
  {body}
  cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {{ snprintf(fb_err, sizeof fb_err, "launch: %s", cudaGetErrorString(e)); return 2; }}
  return 0;
}}
"""
    head = [f"// fusebot catalog: {params.label()}", f"// {signature(p)}", line, PRELUDE, MATH, setup]
    return "\n".join(head) + kernels + fwd


def _size(dtype: str) -> int:
    return {"float16": 2, "bfloat16": 2, "float64": 8, "int64": 8}.get(dtype, 4)
