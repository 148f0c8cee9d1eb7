"""The catalog's scalar ops, one row each: the IR's name, its arity, its C expression (fp32, the same text for the
CPU and CUDA templates, whose prelude defines the fb_* helpers: runner.catalog.codegen.head), its value for constant
folding, and the core-ATen ops that lower to it.

    OPS["relu"].c.format("x")                      # '(x < 0.0f ? 0.0f : x)'
    OPS["powc"].c.format("x", c=["2.0f"])          # 'powf(x, 2.0f)': attributes are C literals c[0], c[1]

`c` is a format string over the arguments {0}, {1}, ... and the attributes {c[0]}, {c[1]} (C float literals), or,
where a literal will not do (an integer attribute), a function of (args, attrs). `fold` gives the value for constant
arguments, or None where it is not defined (a log of a negative: left to the kernel, as torch computes it). `aten`:
the core-ATen ops (runner.catalog.opset) that arrive in the lowering under this name; with `plain`, the lowering
makes them this op of their one input with no attribute (runner.catalog.recognition), other ops it lowers itself
(alpha, rounding modes, exponents and bounds are arguments). Every op here renders: tests/runner/catalog/test_ops.py
renders and folds each one and checks both against torch.
"""

from __future__ import annotations

import math
import operator
import struct
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class ScalarOp:
    name: str
    arity: int
    c: str | Callable[[list[str], tuple[float, ...]], str]
    fold: Callable[[list[float], tuple[float, ...]], float | None] | None = None
    aten: tuple[str, ...] = ()
    plain: bool = False  # lowered as this op of its one input, no attribute (recognition's simple table)
    attrs: int = 0
    costly: bool = False  # a transcendental inside: worth a register rather than computing again


def _div(a: float, b: float) -> float | None:
    return a / b if b else None


def _sigmoid(x: float) -> float:
    return 1.0 / (1.0 + math.exp(-x))


def _gelu(x: float) -> float:
    return 0.5 * x * (1.0 + math.erf(x / math.sqrt(2.0)))


def _holds(x: float, kind: str) -> bool:
    """Is x exactly a bf16 (an fp32 whose low 16 bits are 0) or an fp16 value?"""
    try:
        if kind == "bf16":
            f = struct.unpack("<f", struct.pack("<f", x))[0]
            return f == x and struct.unpack("<I", struct.pack("<f", x))[0] & 0xFFFF == 0
        return struct.unpack("<e", struct.pack("<e", x))[0] == x
    except (OverflowError, struct.error):
        return False


def _rounded(kind: str) -> Callable[[list[float], tuple[float, ...]], float | None]:
    """Rounding keeps 0, the infinities and any value the type holds exactly (finfo.min of a bf16 mask)."""
    return lambda v, _: v[0] if v[0] == 0 or math.isinf(v[0]) or _holds(v[0], kind) else None


def _idivmod(a: list[str], c: tuple[float, ...]) -> str:
    """A coordinate of a merged dim: (x // div) % mod on integers."""
    return f"(float)(((long long){a[0]} / {int(c[0])}LL) % {int(c[1])}LL)"


_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt,
            ">=": operator.ge}


def _cmp(name: str, sym: str, aten: tuple[str, ...]) -> ScalarOp:
    test = _COMPARE[sym]
    return ScalarOp(name, 2, f"(float)({{0}} {sym} {{1}})", lambda v, _: float(test(v[0], v[1])), aten)


_ROWS = [
    # arithmetic (the lowering reads alpha, rounding modes and exponents itself)
    ScalarOp("add", 2, "({0} + {1})", lambda v, _: v[0] + v[1], ("add.Tensor", "add.Scalar")),
    ScalarOp("sub", 2, "({0} - {1})", lambda v, _: v[0] - v[1], ("sub.Tensor", "sub.Scalar")),
    ScalarOp("mul", 2, "({0} * {1})", lambda v, _: v[0] * v[1],
             ("mul.Tensor", "mul.Scalar", "logical_and", "bitwise_and.Tensor")),
    ScalarOp("div", 2, "fb_div({0}, {1})", lambda v, _: _div(v[0], v[1]), ("div.Tensor", "div.Scalar",
                                                                            "div.Tensor_mode")),
    # NaN where either is, as torch's
    ScalarOp("maximum", 2, "(({0} > {1} || {0} != {0}) ? {0} : {1})", lambda v, _: max(v[0], v[1]),
             ("maximum", "logical_or", "bitwise_or.Tensor")),
    ScalarOp("minimum", 2, "(({0} < {1} || {0} != {0}) ? {0} : {1})", lambda v, _: min(v[0], v[1]), ("minimum",)),
    ScalarOp("pow", 2, "powf({0}, {1})", None, ("pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar"), costly=True),
    ScalarOp("powc", 1, "powf({0}, {c[0]})", lambda v, c: math.pow(v[0], c[0]), attrs=1, costly=True),
    ScalarOp("neg", 1, "(-{0})", lambda v, _: -v[0], ("neg",), plain=True),
    ScalarOp("recip", 1, "fb_div(1.0f, {0})", lambda v, _: _div(1.0, v[0]), ("reciprocal",), plain=True),
    ScalarOp("square", 1, "({0} * {0})", lambda v, _: v[0] * v[0], plain=True),
    ScalarOp("cube", 1, "({0} * {0} * {0})", lambda v, _: v[0] ** 3),
    ScalarOp("abs", 1, "fabsf({0})", lambda v, _: abs(v[0]), ("abs",), plain=True),
    ScalarOp("sign", 1, "(float)(({0} > 0.0f) - ({0} < 0.0f))", None, ("sign",), plain=True),
    ScalarOp("trunc", 1, "truncf({0})", None, ("trunc",)),
    # transcendental
    ScalarOp("exp", 1, "fb_exp({0})", lambda v, _: math.exp(v[0]), ("exp",), plain=True, costly=True),
    ScalarOp("expm1", 1, "expm1f({0})", None, ("expm1",), costly=True),
    ScalarOp("log", 1, "fb_log({0})", lambda v, _: math.log(v[0]) if v[0] > 0 else None, ("log",), plain=True, costly=True),
    ScalarOp("log1p", 1, "log1pf({0})", None, ("log1p",), plain=True, costly=True),
    ScalarOp("sqrt", 1, "sqrtf({0})", lambda v, _: math.sqrt(v[0]), ("sqrt",), plain=True),
    ScalarOp("rsqrt", 1, "fb_rsqrt({0})", None, ("rsqrt",), plain=True),
    ScalarOp("erf", 1, "erff({0})", None, ("erf",), plain=True, costly=True),
    ScalarOp("tanh", 1, "fb_tanh({0})", lambda v, _: math.tanh(v[0]), ("tanh",), plain=True, costly=True),
    ScalarOp("sigmoid", 1, "fb_sigmoid({0})", lambda v, _: _sigmoid(v[0]), ("sigmoid",), plain=True, costly=True),
    ScalarOp("cos", 1, "cosf({0})", None, ("cos",), plain=True),
    ScalarOp("sin", 1, "sinf({0})", None, ("sin",), plain=True),
    # activations
    ScalarOp("relu", 1, "({0} < 0.0f ? 0.0f : {0})", lambda v, _: max(v[0], 0.0), ("relu",), plain=True),
    ScalarOp("silu", 1, "({0} * fb_sigmoid({0}))", lambda v, _: v[0] / (1.0 + math.exp(-v[0])), ("silu",),
             plain=True, costly=True),
    ScalarOp("gelu", 1, "(0.5f * {0} * (1.0f + erff({0} * 0.70710678118654752f)))", lambda v, _: _gelu(v[0]),
             ("gelu",), costly=True),
    ScalarOp("gelu_tanh", 1,
             "(0.5f * {0} * (1.0f + fb_tanh(0.7978845608028654f * ({0} + 0.044715f * {0} * {0} * {0}))))", costly=True),
    ScalarOp("mish", 1, "({0} * fb_tanh({0} > 20.0f ? {0} : log1pf(fb_exp({0}))))", None, ("mish",), plain=True, costly=True),
    ScalarOp("softsign", 1, "fb_div({0}, 1.0f + fabsf({0}))", None, plain=True),
    ScalarOp("selu", 1, "(1.0507009873554805f * ({0} > 0.0f ? {0} : 1.6732632423543772f * (fb_exp({0}) - 1.0f)))",
             None, plain=True, costly=True),
    ScalarOp("hardsigmoid", 1, "fb_clamp01({0} * (1.0f / 6.0f) + 0.5f)", None, ("hardsigmoid",), plain=True),
    ScalarOp("hardswish", 1, "({0} * fb_clamp01({0} * (1.0f / 6.0f) + 0.5f))", None, ("hardswish",), plain=True),
    ScalarOp("leaky_relu", 1, "({0} > 0.0f ? {0} : {0} * {c[0]})", lambda v, c: v[0] if v[0] > 0 else v[0] * c[0],
             ("leaky_relu",), attrs=1),
    ScalarOp("elu", 1, "({0} > 0.0f ? {0} : {c[0]} * (fb_exp({0}) - 1.0f))", None, ("elu",), attrs=1, costly=True),
    ScalarOp("softplus", 1, "({0} * {c[0]} > {c[1]} ? {0} : log1pf(fb_exp({0} * {c[0]})) / {c[0]})", None,
             ("softplus",), attrs=2, costly=True),
    # NaN kept (x < lo and x > hi are false for NaN), as torch.clamp
    ScalarOp("clamp_min", 1, "({0} < {c[0]} ? {c[0]} : {0})", lambda v, c: max(v[0], c[0]), ("clamp_min",), attrs=1),
    ScalarOp("clamp_max", 1, "({0} > {c[0]} ? {c[0]} : {0})", lambda v, c: min(v[0], c[0]), ("clamp_max",), attrs=1),
    # comparisons and logic: 1.0 or 0.0
    _cmp("eq", "==", ("eq.Scalar", "eq.Tensor")), _cmp("ne", "!=", ("ne.Scalar", "ne.Tensor")),
    _cmp("lt", "<", ("lt.Scalar", "lt.Tensor")), _cmp("le", "<=", ("le.Scalar", "le.Tensor")),
    _cmp("gt", ">", ("gt.Scalar", "gt.Tensor")), _cmp("ge", ">=", ("ge.Scalar", "ge.Tensor")),
    ScalarOp("not", 1, "(float)({0} == 0.0f)", lambda v, _: float(v[0] == 0), ("logical_not", "bitwise_not")),
    ScalarOp("isnan", 1, "(float)({0} != {0})", None, ("isnan",)),
    ScalarOp("isinf", 1, "(float)(fabsf({0}) == INFINITY)", None, ("isinf",)),
    ScalarOp("where", 3, "({0} != 0.0f ? {1} : {2})", lambda v, _: v[1] if v[0] != 0 else v[2], ("where.self",)),
    ScalarOp("where_lt", 4, "({0} < {1} ? {2} : {3})"),
    # rounding where the reference stores to a half type (folded only where the value is one of its values)
    ScalarOp("round_bf16", 1, "fb_round_bf16({0})", _rounded("bf16")),
    ScalarOp("round_fp16", 1, "fb_round_fp16({0})", _rounded("fp16")),
    ScalarOp("idivmod", 1, _idivmod, attrs=2),
    # kl_div's xlogy(t, t) - t * y: 0 where t == 0, NaN where t < 0 (torch.xlogy), never 0 for a negative t
    ScalarOp("xlogy_minus", 2, "(({0} == 0.0f ? 0.0f : {0} * fb_log({0})) - {0} * {1})"),
]

OPS: dict[str, ScalarOp] = {o.name: o for o in _ROWS}
assert len(OPS) == len(_ROWS), "an op named twice"

# core-ATen name -> the lowering's name, for every op above (runner.catalog.opset adds the structural ones)
ATEN: dict[str, str] = {a: o.name for o in _ROWS for a in o.aten}
# the ops the lowering makes of their one input, with no attribute
PLAIN: frozenset[str] = frozenset(o.name for o in _ROWS if o.plain)


COSTLY: frozenset[str] = frozenset(o.name for o in _ROWS if o.costly)
# the op that rounds a float to a half type, per the type's torch name
ROUND_TO: dict[str, str] = {"bfloat16": "round_bf16", "float16": "round_fp16"}
ROUNDINGS: frozenset[str] = frozenset(ROUND_TO.values())


def render(name: str, args: list[str], attrs: tuple[float, ...], literal: Callable[[float], str]) -> str | None:
    """The C expression of op `name` over argument expressions, attributes written by `literal`; None: no such op."""
    o = OPS.get(name)
    if o is None:
        return None
    if callable(o.c):
        return o.c(args, attrs)
    return o.c.format(*args, c=[literal(v) for v in attrs])


def fold(name: str, values: list[float], attrs: tuple[float, ...]) -> float | None:
    """The op's value on constant arguments, or None where it has none (or is not defined there)."""
    o = OPS.get(name)
    if o is None or o.fold is None:
        return None
    try:
        return o.fold(values, attrs)
    except (ValueError, OverflowError, ZeroDivisionError):
        return None
