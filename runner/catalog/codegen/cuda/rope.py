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
from runner.catalog.sizes import sizes_line, tensor_shape

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
    most = 16 // (2 if p.out_dtype in ROUND else 4)
    out = []
    for v in (8, 4, 2, 1):
        try:
            if v <= most:
                units(r, v)
                out.append(v)
        except NotExpressible:
            pass
    return out


def _inputs(p: Program) -> dict[int, int]:
    """ABI position -> the first program input that reads it (its pointer is the tensor's base)."""
    out: dict[int, int] = {}
    for k, i in enumerate(p.inputs):
        out.setdefault(i.abi, k)
    return out


def _row_offset(r: Rope, t: Table, row: str) -> str:
    """The table's row offset (elements) from a row number, by the captured sizes (constants)."""
    dims = r.shape[:-1]
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


def _kernel(p: Program, r: Rope, V: int, T: int, rnd: str) -> str:
    ins = _inputs(p)
    xt = ctype_of(p.out_dtype)
    ct, st = (ctype_of(p.inputs[ins[t.abi]].dtype) for t in (r.cos, r.sin))
    UR, UP = units(r, V)
    U = UR + UP
    D, h = r.head, r.rot // 2
    lines = [f"const unsigned tid = blockIdx.x * {T}u + threadIdx.x;",
             f"if (tid >= {r.rows * U}u) return;",
             f"const unsigned row = tid / {U}u, u = tid - row * {U}u;",
             f"const long long base = (long long)row * {D}LL;"]
    if UP:
        lines.append(f"if (u >= {UR}u) {{  // the features past the rotated ones: a copy")
        lines.append(f"  const long long at = base + {r.rot} + (long long)(u - {UR}u) * {V};")
        for o, x in enumerate(r.xs):
            out = "a.out" if o == 0 else f"a.more[{o - 1}]"
            lines.append(f"  fb_stv<{xt}, {V}>(({xt}*){out} + at, fb_ldv<{xt}, {V}>((const {xt}*)a.in[{ins[x]}] + at));")
        lines.append("  return;")
        lines.append("}")
    lines.append(f"const int j = (int)u * {V};")
    W = V // 2 if r.style == "pairs" else V

    gathered: dict[tuple, str] = {}  # one load of a row's index for every table it gathers

    def table(name: str, t: Table, ty: str, col: str) -> list[str]:
        ptr = f"(const {ty}*)a.in[{ins[t.abi]}]"
        pre = []
        if t.index is not None:
            key = (t.index, t.strides, t.width)
            if key not in gathered:
                it = ctype_of(p.inputs[ins[t.index]].dtype)
                gathered[key] = f"trow{len(gathered)}"
                pre = [f"const long long {gathered[key]} = (long long)fb_ld1((const {it}*)a.in[{ins[t.index]}] + "
                       f"{_row_offset(r, t, 'row')}) * {t.width}LL;"]
            off = gathered[key]
        else:
            off = _row_offset(r, t, "row")
        n = V // 2 if t.interleave else V
        at = f"({col}) / 2" if t.interleave else f"({col})"
        out = [*pre, f"float {name}[{V}];",
               f"{{ const FbVec<{ty}, {n}> w = fb_ldv<{ty}, {n}>({ptr} + {off} + {t.col} + {at});",
               f"#pragma unroll\n  for (int l = 0; l < {V}; ++l) {name}[l] = fb_f(w.v[{'l / 2' if t.interleave else 'l'}]); }}"]
        return out

    if r.style == "half":
        if r.cos.interleave or r.sin.interleave:
            raise NotExpressible("a rotate_half embedding with tables repeated element by element")
        lines += table("c0", r.cos, ct, "j") + table("c1", r.cos, ct, f"j + {h}")
        lines += table("s0", r.sin, st, "j") + table("s1", r.sin, st, f"j + {h}")
        for o, x in enumerate(r.xs):
            out = "a.out" if o == 0 else f"a.more[{o - 1}]"
            lines += [
                "{",
                f"  const FbVec<{xt}, {V}> x0 = fb_ldv<{xt}, {V}>((const {xt}*)a.in[{ins[x]}] + base + j);",
                f"  const FbVec<{xt}, {V}> x1 = fb_ldv<{xt}, {V}>((const {xt}*)a.in[{ins[x]}] + base + j + {h});",
                f"  FbVec<{xt}, {V}> y0, y1;",
                "#pragma unroll",
                f"  for (int l = 0; l < {V}; ++l) {{",
                "    const float a0 = fb_f(x0.v[l]), a1 = fb_f(x1.v[l]);",
                f"    y0.v[l] = fb_to<{xt}>({rnd}({rnd}(a0 * c0[l]) + {rnd}(-a1 * s0[l])));",
                f"    y1.v[l] = fb_to<{xt}>({rnd}({rnd}(a1 * c1[l]) + {rnd}(a0 * s1[l])));",
                "  }",
                f"  fb_stv<{xt}, {V}>(({xt}*){out} + base + j, y0);",
                f"  fb_stv<{xt}, {V}>(({xt}*){out} + base + j + {h}, y1);",
                "}"]
    else:
        if W < 1:
            raise NotExpressible("pairs need an even vector width")
        lines += table("c", r.cos, ct, "j") + table("s", r.sin, st, "j")
        for o, x in enumerate(r.xs):
            out = "a.out" if o == 0 else f"a.more[{o - 1}]"
            lines += [
                "{",
                f"  const FbVec<{xt}, {V}> x = fb_ldv<{xt}, {V}>((const {xt}*)a.in[{ins[x]}] + base + j);",
                f"  FbVec<{xt}, {V}> y;",
                "#pragma unroll",
                f"  for (int l = 0; l < {V}; l += 2) {{",
                "    const float e = fb_f(x.v[l]), d = fb_f(x.v[l + 1]);",
                f"    y.v[l] = fb_to<{xt}>({rnd}({rnd}(e * c[l]) + {rnd}(-d * s[l])));",
                f"    y.v[l + 1] = fb_to<{xt}>({rnd}({rnd}(d * c[l + 1]) + {rnd}(e * s[l + 1])));",
                "  }",
                f"  fb_stv<{xt}, {V}>(({xt}*){out} + base + j, y);",
                "}"]
    body = "\n".join("  " + x for x in "\n".join(lines).split("\n"))
    return f"\n__global__ void __launch_bounds__({T}) fb_rope_v{V}(FbRope a) {{\n{body}\n}}\n"


def _setup(p: Program, r: Rope, abi_offset: int) -> tuple[str, str]:
    """The sizes line and fb_setup: every tensor the kernel reads has its captured shape and dtype, contiguous."""
    ins = _inputs(p)
    checks = []
    for abi, k in sorted(ins.items()):
        inp = p.inputs[k]
        S = tensor_shape(inp)
        pos = abi + abi_offset
        dims = "".join(f" || t.shape[{j}] != {s}" for j, s in enumerate(S))
        checks += [f"  if (n_in <= {pos}) return fb_fail(\"too few inputs\");",
                   f"  {{ const fb_tensor& t = in[{pos}]; long long want = 1;",
                   f"    if (t.dtype != {DTYPE_CODE.get(inp.dtype, -1)}) return fb_fail(\"input {pos}: expected "
                   f"{inp.dtype}\");",
                   f"    if (t.ndim != {len(S)}{dims}) return fb_fail(\"input {pos}: size differs from the captured one"
                   "\");",
                   "    for (int d = t.ndim - 1; d >= 0; --d) { if (t.shape[d] != 1 && t.strides[d] != want) "
                   f"return fb_fail(\"input {pos} is not contiguous\"); want *= t.shape[d]; }}",
                   f"    a.in[{k}] = t.data; }}"]
    n = prod(r.shape)
    for j, o in enumerate(p.outputs):
        checks += [f"  {{ long long n = 1; for (int d = 0; d < out[{j}].ndim; ++d) n *= out[{j}].shape[d];",
                   f"    if (n != {n}LL) return fb_fail(\"output {j}: size differs from the program's\"); }}",
                   f"  if (out[{j}].dtype != {DTYPE_CODE.get(o.dtype, -1)}) return fb_fail(\"output {j}: dtype\");",
                   f"  a.{'out' if j == 0 else f'more[{j - 1}]'} = out[{j}].data;"]
    setup = "\n".join([
        "static char fb_err[512];",
        "FB_EXPORT const char* fusebot_last_error(void) { return fb_err; }",
        "static int fb_fail(const char* msg) { snprintf(fb_err, sizeof fb_err, \"%s\", msg); return 1; }",
        f"struct FbRope {{ const void* in[{max(len(p.inputs), 1)}]; void* out; void* more[{max(len(p.more), 1)}]; }};",
        "static int fb_setup(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, FbRope* ap) {",
        "  FbRope& a = *ap;",
        f"  if (n_out != {len(p.outputs)}) return fb_fail(\"expected {len(p.outputs)} outputs\");",
        *checks, "  return 0;", "}"])
    return sizes_line(p, abi_offset, "rope"), setup


def render_rope(p: Program, params: CudaParams, abi_offset: int = 0) -> str:
    r = p.rope
    if r is None or p.is_row:
        raise NotExpressible("rope is for the rotary embeddings runner.catalog.rope recognises")
    if len(r.xs) != len(p.outputs) or any(o.dtype != p.out_dtype for o in p.outputs):
        raise NotExpressible("a rotary embedding whose outputs differ in dtype")
    V, T = params.vec, params.threads
    low = 2 if r.style == "pairs" else 1
    if low > V:
        raise NotExpressible("pairs need an even vector width")
    units(r, V)
    if r.rows * sum(units(r, low)) >= 1 << 31:
        raise NotExpressible("2^31 vectors or more: the template's thread ids are 32-bit")
    rnd = ROUND.get(p.out_dtype, "")
    line, setup = _setup(p, r, abi_offset)
    ws = sorted({low, V})
    kernels = "".join(_kernel(p, r, v, T, rnd) for v in ws)

    def launch(v: int) -> str:
        n = r.rows * sum(units(r, v))
        return f"fb_rope_v{v}<<<{(n + T - 1) // T}, {T}, 0, s>>>(a);"

    ptrs = [f"fb_aligned(a.in[{k}], {V} * {_size(p.inputs[k].dtype)})" for k in sorted(set(_inputs(p).values()))
            if p.inputs[k].dtype != "int64"]
    ptrs += [f"fb_aligned({'a.out' if j == 0 else f'a.more[{j - 1}]'}, {V} * {_size(p.out_dtype)})"
             for j in range(len(p.outputs))]
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
