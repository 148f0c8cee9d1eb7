"""Work a mask makes unneeded, skipped where it is provable: a causal mask over the reduced (last) dim.

A row program over [..., T_row, T_col] reduced along its last dim whose value X is masked as

    X = where(col > A, M, Y)        (or where(col <= A, Y, M); masked_fill(~tril, -inf) is this)

with A a per-row expression (the row's own index, offset by a slice: a causal mask from a checked buffer or built
with arange) and M very negative (-inf, or finfo.min where the row keeps at least one element): row i then reads
only its first A + 1 elements. Provable, not assumed: with X replaced by M, every reduction's argument must fold to
that reduction's identity (-inf for max and log-sum-exp, 0 for a sum) and every output to one constant (0 for
softmax), by the IR's own constant folding. Past the limit a template writes that constant without reading.
"""

from __future__ import annotations

from runner.catalog.ir import Const, Expr, Iota, Load, Op, Program, Red, op, rebuild, reductions, walk

IDENTITY = {"max": float("-inf"), "lse": float("-inf"), "sum": 0.0}
NEGATIVE = -1e30  # a mask value at most this: exp(M - max) is 0 in fp32 (the row keeps its first element)


MIRROR = {"gt": "lt", "lt": "gt", "ge": "le", "le": "ge"}
NOT = {"gt": "le", "le": "gt", "ge": "lt", "lt": "ge"}


def _col_limit(cond: Expr, masked_when_true: bool) -> Expr | None:
    """Where the masked positions are 'col > A' (or 'col >= A') with A per row: the row's limit, else None."""
    c, flip = cond, False
    while isinstance(c, Op) and (c.name == "not" or (c.name == "eq" and c.args[1] == Const(0.0))):
        c, flip = c.args[0], not flip
    if not isinstance(c, Op) or c.name not in MIRROR or len(c.args) != 2:
        return None
    x, y = c.args
    if x == Iota(0):
        name, bound = c.name, y
    elif y == Iota(0):
        name, bound = MIRROR[c.name], x
    else:
        return None
    if any(isinstance(e, Load | Red) or e == Iota(0) for e in walk(bound)):
        return None  # the bound must be the row's own index arithmetic
    if flip:
        name = NOT[name]
    if not masked_when_true:
        name = NOT[name]
    if name == "gt":
        return op("add", bound, Const(1.0))
    return bound if name == "ge" else None


def find(p: Program) -> tuple[Expr, float] | None:
    """(limit, value past it) where a causal mask provably lets each row stop early; None otherwise."""
    if not p.is_row or p.axes != (p.ndim - 1,) or p.more or p.has_totals or p.level(p.out) != "full":
        return None
    for w in walk(p.out):
        if not (isinstance(w, Op) and w.name == "where"):
            continue
        cond, yes, no = w.args
        for m, masked_when_true in ((yes, True), (no, False)):
            if not (isinstance(m, Const) and m.value <= NEGATIVE):
                continue
            limit = _col_limit(cond, masked_when_true)
            if limit is None:
                continue
            beyond = _proves(p, w, m)
            if beyond is not None:
                return limit, beyond
    return None


def _proves(p: Program, masked: Expr, m: Const) -> float | None:
    """The output's value where `masked` is m, if every reduction then sees its identity; else None."""
    row_value = Const(1.2345)  # any finite per-row value: the output must not depend on it

    def at_mask(e: Expr) -> Expr:
        if e == masked:
            return m
        if isinstance(e, Red):
            return row_value
        if isinstance(e, Op):
            return op(e.name, *(at_mask(a) for a in e.args), attrs=e.attrs)
        return rebuild(e, at_mask)

    for r in reductions(p.out):
        if masked not in walk(r.arg):
            return None
        ident = IDENTITY.get(r.kind)
        folded = at_mask(r.arg)
        if ident is None or folded != Const(ident):
            return None
    out = at_mask(p.out)
    return out.value if isinstance(out, Const) else None
