"""A tiny builtin proposer for simple targets: it reads the reference's forward and emits one fused kernel.

It understands a forward made of elementwise arithmetic on one input tensor and the module's own parameters and
buffers (`+ - * /`, unary minus, number literals, relu, sigmoid, tanh, exp, silu, gelu, clamp), optionally wrapped in
a softmax over the last dimension. A parameter is broadcast over the trailing dimensions of the input (the kernel
checks that at run time and returns an error otherwise). It writes C++ for the CPU backend and CUDA-C for the GPU, in
the fast format of runner/csrc/fusebot.h. Anything else gets no idea from it: it is the demo's proposer when neither
an LLM nor the builtin strategy catalog is available, not a search strategy.
"""

from __future__ import annotations

import ast
import logging
from dataclasses import dataclass

from runner.contract import Candidate, Verdict
from runner.search.types import History, Idea, ProblemContext, Session

log = logging.getLogger(__name__)

MARKER = "# fusebot: optimize"
_UNARY = {
    "relu": "fb_relu({})", "sigmoid": "fb_sigmoid({})", "tanh": "tanhf({})", "exp": "expf({})",
    "silu": "fb_silu({})", "gelu": "fb_gelu({})",
}
_BINOPS = {ast.Add: "+", ast.Sub: "-", ast.Mult: "*", ast.Div: "/"}


class Unsupported(Exception):
    """The forward is outside what this proposer can translate."""


@dataclass
class Plan:
    expr: str  # a C expression of `v_in` (the input element) and `P<k>` (parameter k at this column)
    params: list[str]  # state_dict names, in order
    softmax: bool


def _marked_class(tree: ast.Module, source: str) -> ast.ClassDef:
    lines = source.splitlines()
    classes = [n for n in tree.body if isinstance(n, ast.ClassDef)]
    for c in classes:
        first = min([c.lineno] + [d.lineno for d in c.decorator_list])
        if first >= 2 and lines[first - 2].strip() == MARKER:
            return c
    for c in classes:
        if c.name == "Model":
            return c
    if classes:
        return classes[0]
    raise Unsupported("no class in the reference")


def _state_names(cls: ast.ClassDef) -> list[str]:
    """Parameters and persistent buffers assigned in __init__, in registration (= state_dict) order."""
    init = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "__init__"), None)
    names: list[str] = []
    for node in ast.walk(init) if init else []:
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            t, v = node.targets[0], node.value
            if (isinstance(t, ast.Attribute) and isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute | ast.Name)
                    and (v.func.attr if isinstance(v.func, ast.Attribute) else v.func.id) == "Parameter"):
                names.append(t.attr)
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "register_buffer"
                and node.args and isinstance(node.args[0], ast.Constant)):
            if any(k.arg == "persistent" and isinstance(k.value, ast.Constant) and not k.value.value
                   for k in node.keywords):
                continue
            names.append(node.args[0].value)
    return names


def _func_name(call: ast.Call) -> str:
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


class _Translator:
    def __init__(self, arg: str, state: list[str]):
        self.arg, self.state, self.locals, self.used = arg, state, {}, []

    def param(self, name: str) -> str:
        if name not in self.state:
            raise Unsupported(f"self.{name} is not a parameter or buffer")
        return f"P{self.state.index(name)}"

    def expr(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            if node.id == self.arg:
                return "v_in"
            if node.id in self.locals:
                return self.locals[node.id]
            raise Unsupported(f"unknown name {node.id}")
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            return f"{float(node.value)!r}f"
        if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id == "self":
            return self.param(node.attr)
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            return f"({self.expr(node.left)} {_BINOPS[type(node.op)]} {self.expr(node.right)})"
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
            return f"(-{self.expr(node.operand)})"
        if isinstance(node, ast.Call):
            name = _func_name(node)
            if name in _UNARY and len(node.args) == 1:
                return _UNARY[name].format(self.expr(node.args[0]))
            if name in _UNARY and not node.args and isinstance(node.func, ast.Attribute):  # x.relu()
                return _UNARY[name].format(self.expr(node.func.value))
            if name == "clamp" and len(node.args) == 1:
                out = self.expr(node.args[0])
                for kw in node.keywords:
                    bound = self.expr(kw.value)
                    out = f"fb_clamp_min({out}, {bound})" if kw.arg == "min" else f"fb_clamp_max({out}, {bound})"
                return out
        raise Unsupported(f"cannot translate {ast.unparse(node)}")


def _softmax_arg(node: ast.AST) -> ast.AST | None:
    """The argument of softmax(..., dim=-1) / x.softmax(-1), or None when `node` is no last-dim softmax."""
    if not (isinstance(node, ast.Call) and _func_name(node) == "softmax"):
        return None
    method = isinstance(node.func, ast.Attribute) and not (isinstance(node.func.value, ast.Name)
                                                           and node.func.value.id in ("torch", "F"))
    args = list(node.args)
    inner = node.func.value if method and isinstance(node.func, ast.Attribute) else (args.pop(0) if args else None)
    dims = args + [k.value for k in node.keywords if k.arg == "dim"]
    if inner is None or len(dims) != 1 or ast.unparse(dims[0]) not in ("-1",):
        raise Unsupported("only a softmax over the last dimension (dim=-1) is supported")
    return inner


def plan(source: str) -> Plan:
    """Translate the marked (or only) class's forward, or raise Unsupported."""
    tree = ast.parse(source)
    cls = _marked_class(tree, source)
    fwd = next((f for f in cls.body if isinstance(f, ast.FunctionDef) and f.name == "forward"), None)
    if fwd is None or len(fwd.args.args) != 2:
        raise Unsupported("forward must take exactly one tensor")
    tr = _Translator(fwd.args.args[1].arg, _state_names(cls))
    for stmt in fwd.body:
        if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant):
            continue  # a docstring
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            tr.locals[stmt.targets[0].id] = tr.expr(stmt.value)
            continue
        if isinstance(stmt, ast.Return) and stmt.value is not None:
            inner = _softmax_arg(stmt.value)
            return Plan(expr=tr.expr(inner if inner is not None else stmt.value), params=tr.state,
                        softmax=inner is not None)
        raise Unsupported(f"cannot translate statement {ast.unparse(stmt)}")
    raise Unsupported("forward returns nothing")


# ---- code generation -------------------------------------------------------------------------------------------

_HELPERS = """\
static FB_INLINE float fb_relu(float v) { return v < 0.0f ? 0.0f : v; }  // NaN stays NaN, as torch.relu
static FB_INLINE float fb_clamp_min(float v, float b) { return v < b ? b : v; }
static FB_INLINE float fb_clamp_max(float v, float b) { return v > b ? b : v; }
static FB_INLINE float fb_sigmoid(float v) { return 1.0f / (1.0f + expf(-v)); }
static FB_INLINE float fb_silu(float v) { return v / (1.0f + expf(-v)); }
static FB_INLINE float fb_gelu(float v) { return 0.5f * v * (1.0f + erff(v * 0.7071067811865476f)); }
"""

_CHECKS = """\
  if (n_in != {n_in} || n_out != 1) return 1;
  for (int k = 0; k < n_in; ++k) if (in[k].dtype != FB_FLOAT32) return 2;
  const fb_tensor* x = &in[0];
  int64_t numel = 1;
  for (int d = 0; d < x->ndim; ++d) numel *= x->shape[d];
  const int64_t cols = x->ndim ? x->shape[x->ndim - 1] : 1;
  const float* xin = (const float*)x->data;
  float* y = (float*)out[0].data;
  int64_t out_numel = 1;
  for (int d = 0; d < out[0].ndim; ++d) out_numel *= out[0].shape[d];
  if (out[0].dtype != FB_FLOAT32 || out_numel < numel) return 5;  // never write past the caller's buffer
{params}"""

_PARAM = """\
  const float* p{k} = (const float*)in[{idx}].data;
  int64_t n{k} = 1;
  for (int d = 0; d < in[{idx}].ndim; ++d) n{k} *= in[{idx}].shape[d];
  if (n{k} != 1 && (in[{idx}].shape[in[{idx}].ndim - 1] != cols || n{k} != cols)) return 3;  // scalar or [cols]
"""


def _helpers(p: Plan) -> str:
    return "".join(line + "\n" for line in _HELPERS.splitlines() if line.split("(")[0].split()[-1] in p.expr)


def _prologue(p: Plan) -> str:
    params = "".join(_PARAM.format(k=k, idx=k + 1) for k in range(len(p.params)))
    return _CHECKS.format(n_in=1 + len(p.params), params=params)


def _args(p: Plan) -> tuple[str, str]:
    decl = "".join(f", const float* __restrict__ p{k}, int64_t n{k}" for k in range(len(p.params)))
    call = "".join(f", p{k}, n{k}" for k in range(len(p.params)))
    return decl, call


def _expr(p: Plan, cuda: bool) -> str:
    """The element expression with each parameter read at column `c` (a scalar parameter broadcast)."""
    out = p.expr
    for k in reversed(range(len(p.params))):  # P10 before P1
        out = out.replace(f"P{k}", f"(n{k} == 1 ? p{k}[0] : p{k}[c])" if cuda else f"q{k}[c]")
    return out


def _describe(p: Plan) -> str:
    return f"// fused by fusebot's seed proposer: {'softmax(' if p.softmax else ''}{p.expr}{')' if p.softmax else ''}\n"


def cpp_source(p: Plan, parallel: bool) -> str:
    """C++: rows x columns; a scalar parameter is spread over a row-sized buffer so the inner loop vectorizes."""
    omp = "  #pragma omp parallel for schedule(static)\n" if parallel else ""
    head = _describe(p) + '#include <math.h>\n#include <vector>\n#include "fusebot.h"\n#define FB_INLINE inline\n'
    spread = "".join(f"  std::vector<float> w{k}(n{k} == 1 ? cols : 0, p{k}[0]);\n"
                     f"  const float* __restrict__ q{k} = n{k} == 1 ? w{k}.data() : p{k};\n"
                     for k in range(len(p.params)))
    body = (f"FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, "
            f"void* stream) {{\n  (void)stream;\n{_prologue(p)}{spread}"
            f"  const int64_t rows = cols ? numel / cols : 0;\n{omp}"
            "  for (int64_t r = 0; r < rows; ++r) {\n"
            "    const float* __restrict__ xr = xin + r * cols;\n    float* __restrict__ yr = y + r * cols;\n")
    e = _expr(p, cuda=False)
    if not p.softmax:
        body += f"    for (int64_t c = 0; c < cols; ++c) {{\n      const float v_in = xr[c];\n      yr[c] = {e};\n    }}\n"
    else:
        body += ("    float s = 0.0f;\n"
                 f"    for (int64_t c = 0; c < cols; ++c) {{\n      const float v_in = xr[c];\n      yr[c] = {e};\n    }}\n"
                 "    float m = yr[0];  // (no infinities: fast math may assume there are none)\n"
                 "    for (int64_t c = 1; c < cols; ++c) m = yr[c] > m ? yr[c] : m;\n"
                 "    for (int64_t c = 0; c < cols; ++c) { const float v = expf(yr[c] - m); yr[c] = v; s += v; }\n"
                 "    const float inv = 1.0f / s;\n"
                 "    for (int64_t c = 0; c < cols; ++c) yr[c] *= inv;\n")
    return head + _helpers(p) + body + "  }\n  return 0;\n}\n"


def cuda_source(p: Plan, threads: int) -> str:
    decl, call = _args(p)
    e = _expr(p, cuda=True)
    head = _describe(p) + ('#include <math.h>\n#include <cuda_runtime.h>\n#include "fusebot.h"\n'
                           '#define FB_INLINE __device__ inline\n' + _helpers(p))
    if not p.softmax:
        kern = (f"__global__ void fb_fused_elementwise(const float* __restrict__ xin, float* __restrict__ y, "
                f"int64_t numel, int64_t cols{decl}) {{\n"
                "  for (int64_t i = blockIdx.x * (int64_t)blockDim.x + threadIdx.x; i < numel; "
                "i += (int64_t)gridDim.x * blockDim.x) {\n"
                f"    const int64_t c = i % cols;\n    const float v_in = xin[i];\n    y[i] = {e};\n  }}\n}}\n")
        launch = (f"  if (numel == 0) return 0;\n  int64_t blocks = (numel + {threads} - 1) / {threads};\n"
                  "  if (blocks > 65535 * 8) blocks = 65535 * 8;\n"
                  f"  fb_fused_elementwise<<<(unsigned)blocks, {threads}, 0, (cudaStream_t)stream>>>(xin, y, numel, "
                  f"cols{call});\n")
    else:
        kern = (f"__global__ void fb_fused_softmax(const float* __restrict__ xin, float* __restrict__ y, "
                f"int64_t cols{decl}) {{\n"
                f"  __shared__ float red[{threads}];\n"
                "  const int64_t r = blockIdx.x;\n  float m = -INFINITY;\n"
                "  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {\n"
                f"    const int64_t i = r * cols + c;\n    const float v_in = xin[i];\n    const float v = {e};\n"
                "    y[i] = v;\n    m = fmaxf(m, v);\n  }\n"
                "  red[threadIdx.x] = m;\n  __syncthreads();\n"
                "  for (int s = blockDim.x / 2; s > 0; s >>= 1) {\n"
                "    if (threadIdx.x < s) red[threadIdx.x] = fmaxf(red[threadIdx.x], red[threadIdx.x + s]);\n"
                "    __syncthreads();\n  }\n  m = red[0];\n  __syncthreads();\n  float sum = 0.0f;\n"
                "  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) {\n"
                "    const float ex = expf(y[r * cols + c] - m);\n    y[r * cols + c] = ex;\n    sum += ex;\n  }\n"
                "  red[threadIdx.x] = sum;\n  __syncthreads();\n"
                "  for (int s = blockDim.x / 2; s > 0; s >>= 1) {\n"
                "    if (threadIdx.x < s) red[threadIdx.x] += red[threadIdx.x + s];\n    __syncthreads();\n  }\n"
                "  const float inv = 1.0f / red[0];\n"
                "  for (int64_t c = threadIdx.x; c < cols; c += blockDim.x) y[r * cols + c] *= inv;\n}\n")
        launch = ("  const int64_t rows = cols ? numel / cols : 0;\n  if (rows == 0) return 0;\n"
                  f"  fb_fused_softmax<<<(unsigned)rows, {threads}, 0, (cudaStream_t)stream>>>(xin, y, cols{call});\n")
    body = (f"FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, "
            f"void* stream) {{\n{_prologue(p)}{launch}  return cudaGetLastError() == cudaSuccess ? 0 : 4;\n}}\n")
    return head + kern + body


# ---- the proposer ----------------------------------------------------------------------------------------------

IDEA_FUSED = "fuse the whole forward into one pass over memory (one kernel, no intermediates)"


class SeedProposer:
    """Proposes one idea (fuse everything) with two implementations (plain, and with fast math)."""

    name = "seed"

    def bind(self, session: Session) -> None:
        self.session = session

    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        if any(i.text == IDEA_FUSED for i in history.ideas):
            return []  # one idea, tried once
        try:
            plan(ctx.reference_source)
        except (Unsupported, SyntaxError) as e:
            log.info("seed proposer has no idea for %s: %s", ctx.name, e)
            return []
        return [Idea(text=IDEA_FUSED)][:n]

    def implement(self, ctx: ProblemContext, idea: Idea, history: History, n: int) -> list[Candidate]:
        p = plan(ctx.reference_source)
        if ctx.backend == "cuda":  # a plain build, then 512 threads with fast math (vectorized exp)
            variants = [({"kernel.cu": cuda_source(p, 256)}, []),
                        ({"kernel.cu": cuda_source(p, 512)}, ["--use_fast_math"])]
        else:  # plain, then fast math (lets the compiler vectorize exp and the reductions); serial: a thread pool
            # loses on small rows and on a shared machine, and the harness compares with one-thread baselines there
            variants = [({"kernel.cpp": cpp_source(p, False)}, []),
                        ({"kernel.cpp": cpp_source(p, False)}, ["-ffast-math"])]
        return [Candidate(id=f"seed-{k}", format="fast", backend=ctx.backend, sources=src, extra_cflags=flags,
                          idea=idea.text) for k, (src, flags) in enumerate(variants[:n])]

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        return None


def seed_proposers() -> list[tuple[SeedProposer, float]]:
    return [(SeedProposer(), 1.0)]
