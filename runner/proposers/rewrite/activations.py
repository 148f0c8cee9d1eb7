"""Hand-written activations to their library calls, found by value: an elementwise expression of one tensor (the
same plain expression at every leaf, constants, arithmetic and the elementwise torch/math functions) is evaluated on
probe points in float64 and compared with each library activation. `x * torch.sigmoid(x)`, `x / (1 + torch.exp(-x))`
and `x.mul(x.sigmoid())` are all F.silu; every spelling of the tanh-GELU formula is F.gelu(x, approximate="tanh").
"""

from __future__ import annotations

import ast
import math
from collections.abc import Callable

from runner.proposers.rewrite.match import Ctx, Match
from runner.proposers.rewrite.source import plain, same

PROBES = (-6.1, -4.3, -3.0, -2.2, -1.5, -1.0, -0.7, -0.35, -0.1, 0.05, 0.2, 0.45, 0.8, 1.1, 1.6, 2.3, 3.1, 4.4,
          5.9, 7.5)
RTOL = 1e-9


def _sigmoid(t: float) -> float:
    return 1 / (1 + math.exp(-t))


def _softplus(t: float) -> float:
    return t if t > 20 else math.log1p(math.exp(t))


def _relu6(t: float) -> float:
    return min(max(t, 0.0), 6.0)


UNARY: dict[str, Callable[[float], float]] = {
    "exp": math.exp, "tanh": math.tanh, "sigmoid": _sigmoid, "expit": _sigmoid, "erf": math.erf, "sqrt": math.sqrt,
    "rsqrt": lambda t: 1 / math.sqrt(t), "log": math.log, "log1p": math.log1p, "abs": abs, "square": lambda t: t * t,
    "relu": lambda t: max(t, 0.0), "relu6": _relu6, "softplus": _softplus, "neg": lambda t: -t,
}
UNARY_ORIGINS = {f"{m}.{n}" for m in ("torch", "torch.special", "torch.nn.functional", "math") for n in UNARY}
BINARY = {"mul": lambda a, b: a * b, "add": lambda a, b: a + b, "sub": lambda a, b: a - b,
          "div": lambda a, b: a / b, "pow": lambda a, b: a ** b, "maximum": max, "max": max, "minimum": min,
          "min": min}
OPS = {ast.Add: lambda a, b: a + b, ast.Sub: lambda a, b: a - b, ast.Mult: lambda a, b: a * b,
       ast.Div: lambda a, b: a / b, ast.Pow: lambda a, b: a ** b}
CONSTANTS = {"math.pi": math.pi, "math.e": math.e, "torch.pi": math.pi, "numpy.pi": math.pi}
ROOT_CALLS = {"torch.max", "torch.maximum", "torch.min", "torch.minimum", "torch.mul", "torch.div", "torch.clamp",
              "torch.clip"}
ROOT_METHODS = {"mul", "div", "add", "sub", "clamp", "clamp_min", "clamp_max"}


def _gelu_tanh(t: float) -> float:
    return 0.5 * t * (1 + math.tanh(math.sqrt(2 / math.pi) * (t + 0.044715 * t ** 3)))


# (library call template, what it is, its value in float64)
TARGETS: list[tuple[str, str, Callable[[float], float]]] = [
    ("F.silu(X)", "SiLU", lambda t: t * _sigmoid(t)),
    ("F.gelu(X)", "GELU (erf)", lambda t: 0.5 * t * (1 + math.erf(t / math.sqrt(2)))),
    ("F.gelu(X, approximate='tanh')", "GELU (tanh approximation)", _gelu_tanh),
    ("T.sigmoid(X)", "sigmoid", _sigmoid),
    ("F.mish(X)", "Mish", lambda t: t * math.tanh(_softplus(t))),
    ("F.softplus(X)", "softplus", _softplus),
    ("F.hardswish(X)", "hard-swish", lambda t: t * _relu6(t + 3) / 6),
    ("F.hardsigmoid(X)", "hard-sigmoid", lambda t: _relu6(t + 3) / 6),
    ("T.tanh(X)", "tanh", math.tanh),
    ("T.relu(X)", "ReLU", lambda t: max(t, 0.0)),
    ("F.relu6(X)", "ReLU6", _relu6),
]


class _NotElementwise(Exception):  # noqa: N818 - control flow inside this module
    pass


class _Compiler:
    def __init__(self, ctx: Ctx, resolve: bool):
        self.ctx, self.resolve = ctx, resolve
        self.var: ast.AST | None = None
        self.ops = 0

    def __call__(self, node: ast.AST) -> Callable[[float], float]:  # noqa: C901 - one case per node kind
        ctx = self.ctx
        if isinstance(node, ast.Constant) and isinstance(node.value, int | float) and not isinstance(node.value, bool):
            v = float(node.value)
            return lambda t: v
        q = ctx.qual(node) if isinstance(node, ast.Name | ast.Attribute) else None
        if q in CONSTANTS:
            c = CONSTANTS[q]
            return lambda t: c
        if isinstance(node, ast.Name) and self.resolve and node.id in ctx.temps:
            return self(ctx.r(node))
        if isinstance(node, ast.Name | ast.Attribute | ast.Subscript) and plain(node):
            if self.var is None:
                self.var = node
            elif not same(self.var, node):
                raise _NotElementwise
            return lambda t: t
        if isinstance(node, ast.BinOp) and type(node.op) in OPS:
            op, a, b = OPS[type(node.op)], self(node.left), self(node.right)
            self.ops += 1
            return lambda t: op(a(t), b(t))
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub | ast.UAdd):
            a, sign = self(node.operand), -1.0 if isinstance(node.op, ast.USub) else 1.0
            return lambda t: sign * a(t)
        if not isinstance(node, ast.Call) or any(k.arg not in ("min", "max") for k in node.keywords):
            raise _NotElementwise
        self.ops += 1
        q = ctx.qual(node.func)
        if q is not None:
            name, args = q.rsplit(".", 1)[1], list(node.args)
        elif isinstance(node.func, ast.Attribute):
            name, args = node.func.attr, [node.func.value, *node.args]
        else:
            raise _NotElementwise
        if q in ("torch.zeros_like", "torch.ones_like") and len(args) == 1:
            self(args[0])
            c = 0.0 if q == "torch.zeros_like" else 1.0
            return lambda t: c
        if name in ("clamp", "clip", "clamp_min", "clamp_max") and (q is None or q in ("torch.clamp", "torch.clip")):
            kw = {k.arg: k.value for k in node.keywords}
            pos = args[1:] + [None, None]
            lo, hi = kw.get("min", pos[0]), kw.get("max", pos[1])
            if name == "clamp_min":
                lo, hi = pos[0], None
            elif name == "clamp_max":
                lo, hi = None, pos[0]
            x, lo_f, hi_f = self(args[0]), self(lo) if lo is not None else None, self(hi) if hi is not None else None
            return lambda t: min(max(x(t), lo_f(t) if lo_f else -math.inf), hi_f(t) if hi_f else math.inf)
        if name in UNARY and len(args) == 1 and (q is None or q in UNARY_ORIGINS) and not node.keywords:
            f, a = UNARY[name], self(args[0])
            return lambda t: f(a(t))
        if name in ("max", "min") and isinstance(args[-1], ast.Constant | ast.UnaryOp):
            raise _NotElementwise  # x.max(-1): a reduction over a dim, not an elementwise maximum
        if name in BINARY and len(args) == 2 and (q is None or q.startswith("torch.")) and not node.keywords:
            f, a, b = BINARY[name], self(args[0]), self(args[1])
            return lambda t: f(a(t), b(t))
        raise _NotElementwise


def _root(node: ast.expr, ctx: Ctx) -> bool:
    """A hand-written formula: arithmetic at its root, or torch.max(x, zeros) and the like; not a library call."""
    if isinstance(node, ast.BinOp | ast.UnaryOp):
        return True
    if isinstance(node, ast.Call):
        q = ctx.qual(node.func)
        method = q is None and isinstance(node.func, ast.Attribute)
        if q in UNARY_ORIGINS and node.args or method and node.func.attr in UNARY:  # log(1 + exp(x)), not log(x)
            return not plain(node.args[0] if q else node.func.value)
        return q in ROOT_CALLS or (method and node.func.attr in ROOT_METHODS)
    return False


def _close(g: Callable[[float], float], h: Callable[[float], float]) -> bool:
    try:
        return all(abs(g(t) - h(t)) <= RTOL * max(1.0, abs(h(t))) for t in PROBES)
    except (ArithmeticError, ValueError, TypeError):
        return False


def activation(node: ast.expr, ctx: Ctx) -> Match | None:
    """An elementwise formula of one plain tensor expression that equals a library activation."""
    if not _root(node, ctx):
        return None
    for resolve in (False, True):
        ctx.used.clear()
        comp = _Compiler(ctx, resolve)
        try:
            g = comp(node)
        except _NotElementwise:
            continue
        if comp.var is None or comp.ops < 2:
            return None
        for template, what, h in TARGETS:
            if template.startswith("F.mish") and not ctx.F:
                continue
            if _close(g, h):
                new = ctx.build(template, X=comp.var)
                return Match(new, f"a hand-written {what} is the library's {ast.unparse(new).split('(')[0]}: one "
                                  "elementwise kernel instead of one per operation and its temporaries")
    return None
