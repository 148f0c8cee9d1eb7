"""What recognition returns (Pattern, Heavy, Unsupported) and the expression rewrites and checks it applies
to a lowered program.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import Any

from runner.catalog.ir import (
    Const,
    Expr,
    Gather,
    Input,
    Load,
    Op,
    Program,
    Red,
    level,
    rebuild,
    reductions,
    walk,
)

HEAVY = {"linear", "matmul", "conv1d", "conv2d", "conv3d", "convtranspose2d", "convtranspose3d", "addmm", "einsum"}
IDENTITY = {"identity", "contiguous", "clone", "dropout", "detach", "float", "type_as"}


class Unsupported(Exception):  # noqa: N818 - a verdict on the pattern, not an error
    pass


@dataclass
class Heavy:
    """The op that stays on torch, with its tensor arguments as ABI indices."""

    op: str
    module: str | None
    args_abi: list[int]
    kwargs: dict[str, Any]
    shape: list[int]
    dtype: str
    call_args: list[Any] = field(default_factory=list)  # positional args: {"abi": k} for tensors, else constants


@dataclass
class Pattern:
    family: str  # elementwise | row | epilogue | graph | unsupported
    program: Program | None = None  # graph: the largest fused program (the one the search's parameters tune)
    heavy: Heavy | None = None
    reason: str = ""
    notes: list[str] = field(default_factory=list)
    plan: Any = None  # graph: runner.catalog.schedule.Plan, each fused stage with its pattern


@dataclass
class Refusal:
    """A value the catalog cannot read: refused with its reason where an op uses it."""

    why: str


def guarded_max(m: Expr) -> Expr | None:
    """R where m is Red(max, X) or ATen's where(|R| == inf, 0, R) around it: the max a log-sum-exp subtracts."""
    if isinstance(m, Red) and m.kind == "max":
        return m
    if isinstance(m, Op) and m.name == "where" and len(m.args) == 3 and isinstance(m.args[2], Red) \
            and m.args[2].kind == "max" and m.args[1] == Const(0.0):
        return m.args[2]
    return None


def fold_lse(e: Expr) -> Expr:
    """log(sum(exp(X - M))) + M, M the row's max of X (as torch.logsumexp decomposes): one log-sum-exp of X."""
    if isinstance(e, Red):
        return Red(e.kind, fold_lse(e.arg))
    if not isinstance(e, Op):
        return e
    e = Op(e.name, tuple(fold_lse(a) for a in e.args), e.attrs)
    if e.name == "add" and len(e.args) == 2:
        for lg, m in (e.args, e.args[::-1]):
            if not (isinstance(lg, Op) and lg.name == "log" and isinstance(lg.args[0], Red)
                    and lg.args[0].kind == "sum"):
                continue
            ex = lg.args[0].arg
            if not (isinstance(ex, Op) and ex.name == "exp" and isinstance(ex.args[0], Op) and ex.args[0].name == "sub"):
                continue
            x, m1 = ex.args[0].args
            r = guarded_max(m1)
            if r is not None and r.arg == x and guarded_max(m) == r:
                return Red("lse", x)
    return e


def prune(e: Expr, inputs: list[Input]) -> tuple[Expr, list[Input]]:
    """Drop inputs the expression does not read; renumber its loads."""
    (out,), ins = prune_all([e], inputs)
    return out, ins


def prune_all(es: list[Expr], inputs: list[Input]) -> tuple[list[Expr], list[Input]]:
    """Drop inputs no expression reads; renumber their loads."""
    used = sorted({x.k for e in es for x in walk(e) if isinstance(x, Load)})
    mapping = {Load(k): Load(j) for j, k in enumerate(used)}
    return [subst_all(e, mapping) for e in es], [inputs[k] for k in used]


def subst_all(e: Expr, mapping: dict) -> Expr:
    if e in mapping:
        return mapping[e]
    return rebuild(e, lambda c: subst_all(c, mapping))


def describe(e: Expr) -> list[str]:
    """Plain names of well-known shapes of expression (RMS norm, minGPT's GELU)."""
    out = []
    nodes = walk(e)
    consts = {round(x.value, 6) for x in nodes if isinstance(x, Const)}
    if any(isinstance(x, Op) and x.name == "tanh" for x in nodes) and 0.797885 in consts and 0.044715 in consts:
        out.append("GELU in its tanh form (minGPT's new GELU)")
    for r in reductions(e):
        if r.kind == "mean" and isinstance(r.arg, Op) and r.arg.name == "square" and level(e) == "full":
            out.append("RMS norm: one mean of squares per row")
        if r.kind == "sum" and isinstance(r.arg, Op) and r.arg.name == "square":
            out.append("L2 norm: sqrt of a sum of squares")
    return out


def is_float(dtype: str | None) -> bool:
    return dtype in ("float32", "float64", "bfloat16", "float16")


def broadcast_shape(a, b) -> tuple[int, ...]:
    n = max(len(a), len(b))
    a = (1,) * (n - len(a)) + tuple(a)
    b = (1,) * (n - len(b)) + tuple(b)
    return tuple(max(x, y) for x, y in zip(a, b, strict=True))


def in_red(root: Expr, x: Expr) -> bool:
    return any(x in walk(r.arg) for r in reductions(root))


def substitute(e: Expr, mapping: dict[Expr, Expr]) -> Expr:
    if e in mapping:
        return mapping[e]
    if isinstance(e, Op | Gather):
        return rebuild(e, lambda c: substitute(c, mapping))
    return e  # a Red keeps its own (full-space) loads


def check_program(p: Program, low: Any = None) -> None:
    """Every load broadcasts into F and the output has the size its level says."""
    F = p.shape
    if len(F) > 8:
        raise Unsupported("more than 8 dims")
    for k, inp in enumerate(p.inputs):
        s = inp.shape
        if inp.strides is not None and len(s) <= len(F):
            continue  # a strided view clamps its coordinates: any position of F reads inside it
        if len(s) > len(F) or any(x not in (1, f) for x, f in zip(p.padded(k), F, strict=True)):
            raise Unsupported(f"input {inp.abi} of shape {list(inp.shape)} does not broadcast to {list(F)}")
    n_outer, _, n_inner = p.split()
    if any(p.level(o.expr) != p.level(p.out) for o in p.more):
        raise Unsupported("outputs of different levels (one per element, another per row)")
    numel = prod(p.out_shape) if p.out_shape else 1
    if p.has_totals:
        if numel != 1 or p.more:
            raise Unsupported("a reduction over every row with more than one output value")
    elif p.is_row:
        want = prod(F) if p.level(p.out) == "full" else n_outer * n_inner
        if numel != want:
            raise Unsupported(f"an output of {numel} elements where its level gives {want}")
    elif numel != prod(F or (1,)):
        raise Unsupported(f"output of {list(p.out_shape)} from a space of {list(F)}")
