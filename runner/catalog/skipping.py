"""Work a mask makes unneeded, skipped where it is provable: a causal mask over the reduced (last) dim.

A row program over [..., T_row, T_col] reduced along its last dim whose value X is masked as

    X = where(col > A, M, Y)        (or where(col <= A, Y, M); masked_fill(~tril, -inf) is this)

with A a per-row expression (the row's own index, offset by a slice: a causal mask from a checked buffer or built
with arange) and M very negative (-inf, or finfo.min where the row keeps at least one element): row i then reads
only its first A + 1 elements. Provable, not assumed: with X replaced by M, every reduction's argument must fold to
that reduction's identity (-inf for max and log-sum-exp, 0 for a sum; for max and log-sum-exp also a finite M <=
-1e30 where the limit is >= 1 on every row, `_keeps_one`: the row's max is then one of its kept, finite scores and
exp(M - max) is exactly 0) and every output to one constant (0 for softmax), by the IR's own constant folding. Past
the limit a template writes that constant without reading.

What qualifies: the mask's condition must be the column index against a per-row bound built from the row's own
coordinates (`col <= row + offset`): an Iota, i.e. arange in the forward, or a registered boolean buffer whose
lower-triangular structure the capture checked (runner.catalog.capture TRIL: GPT-2's `bias[:, :, k - q : k, :k]`).
A mask read from an input tensor (a padding mask, an arbitrary attention mask) never qualifies for skipping: its
values are not known when the kernel is generated.

A padding mask (`find_guard`): a row program whose output is per row and whose reductions are all sums, with an
input G (the mask) that varies along the reduced dims but not the inner ones, such that with G = 0 every sum's
argument folds to 0 (G multiplies what it sums: masked mean pooling's `sum(x * m) / sum(m)`), reads G first and skips
an element (the C++ columns template: a whole token's features) where G is 0 (`Program.skip_zero`). The rule takes
x * 0 = 0, so it holds for finite values of the other inputs; a NaN or an infinity under a padded position, which the
reference would spread into the row's sum, is not read. An additive mask (`scores + (1 - m) * finfo.min`, BERT's and
T5's attention) is not skipped: its softmax is exactly 0 at a padded key only where the row keeps an unpadded one,
and a row with none is the softmax of its scores plus the same constant, which reads every score.
"""

from __future__ import annotations

from runner.catalog.ir import Const, Expr, Iota, Load, Op, Program, Red, op, rebuild, reductions, walk
from runner.catalog.ops import ROUNDINGS

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


def find(p: Program) -> tuple[Expr, float, tuple[Expr, Expr]] | None:
    """(limit, value past it, (the mask's `where`, its kept branch)) where a causal mask provably lets each row stop
    early; None otherwise. Before the limit the `where` is its kept branch: exactly those positions are unmasked."""
    if not p.is_row or p.axes != (p.ndim - 1,) or p.more or p.has_totals or p.level(p.out) != "full":
        return None
    for w in walk(p.out):
        added = _added_mask(w)
        if added is not None:  # y + where(cond, 0, M): the masked positions are y + M, as negative as M itself
            cond, m, kept = added
            limit = _col_limit(cond, False)
            if limit is not None:
                beyond = _proves(p, w, m, _keeps_one(limit))
                if beyond is not None:
                    return limit, beyond, (w, kept)
            continue
        if not (isinstance(w, Op) and w.name == "where"):
            continue
        cond, yes, no = w.args
        for m, masked_when_true in ((yes, True), (no, False)):
            if not (isinstance(m, Const) and m.value <= NEGATIVE):
                continue
            limit = _col_limit(cond, masked_when_true)
            if limit is None:
                continue
            beyond = _proves(p, w, m, _keeps_one(limit))
            if beyond is not None:
                return limit, beyond, (w, no if masked_when_true else yes)
    return None


def _added_mask(e: Expr) -> tuple[Expr, Const, Expr] | None:
    """(cond, M, kept) where e is an additive mask, `y + where(cond, 0, M)` (each side perhaps rounded to a half
    dtype, the sum too: transformers' `scores + causal_mask` with the mask built by `full(finfo.min)` and
    `masked_fill_`): kept, where cond holds, is y (y + 0, rounded as e rounds it); elsewhere e is y + M, which for a
    score y below |M| - 1e30 (every finite score short of the float's own maximum) is at most NEGATIVE, so it counts
    as M does for the row's max, log-sum-exp and sum: the row's max is a kept score and exp(y + M - max) is exactly 0.
    A NaN or an infinity under the mask, which the reference would spread into its row, is not read (as the padding
    rule below takes its other inputs as finite)."""
    outer = e.name if isinstance(e, Op) and e.name in ROUNDINGS else None
    s = e.args[0] if outer else e
    if not (isinstance(s, Op) and s.name == "add" and len(s.args) == 2):
        return None
    for y, w in (s.args, s.args[::-1]):
        rounds, inner = [], w
        while isinstance(inner, Op) and inner.name in ROUNDINGS:
            rounds.append(inner.name)
            inner = inner.args[0]
        if not (isinstance(inner, Op) and inner.name == "where" and inner.args[1] == Const(0.0)):
            continue
        m = inner.args[2]
        for name in reversed(rounds):  # finfo(bf16).min rounded to bf16 is itself: the IR folds it
            m = op(name, m)
        if isinstance(m, Const) and m.value <= NEGATIVE:
            return inner.args[0], m, op(outer, y) if outer else y
    return None


def _keeps_one(limit: Expr) -> bool:
    """Is the limit at least 1 on every row: a sum of the row's coordinates (Iotas, each >= 0) times non-negative
    constants, plus constants, that is >= 1 where every coordinate is 0 (a causal mask keeps its first column)?"""
    def ok(e: Expr) -> bool:
        if isinstance(e, Iota | Const):
            return True
        if isinstance(e, Op) and e.name == "add":
            return all(ok(a) for a in e.args)
        if isinstance(e, Op) and e.name == "mul":
            consts = [a for a in e.args if isinstance(a, Const)]
            return len(consts) == 1 and consts[0].value >= 0 and all(ok(a) for a in e.args)
        return False

    def at_zero(e: Expr) -> Expr:
        return Const(0.0) if isinstance(e, Iota) else rebuild(e, at_zero) if not isinstance(e, Op) else \
            op(e.name, *(at_zero(a) for a in e.args), attrs=e.attrs)

    lowest = at_zero(limit)
    return ok(limit) and isinstance(lowest, Const) and lowest.value >= 1


def _proves(p: Program, masked: Expr, m: Const, keeps_one: bool = False) -> float | None:
    """The output's value where `masked` is m, if every reduction then sees its identity; else None. With
    `keeps_one` (every row keeps an element), a finite m at most NEGATIVE (finfo.min, as GPT-2's and transformers'
    eager attention mask) counts as the identity of max and log-sum-exp: the row's max is then an element it keeps,
    and exp(m - max) is exactly 0 in fp32 and fp64 alike, as the reference computes it."""
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
        negative = keeps_one and r.kind in ("max", "lse") and isinstance(folded, Const) and folded.value <= NEGATIVE
        if ident is None or (folded != Const(ident) and not negative):
            return None
    out = at_mask(p.out)
    return out.value if isinstance(out, Const) else None


def _at_zero(e: Expr, k: int) -> Expr:
    """e with input k's load replaced by 0, folded (x * 0 = 0: the other inputs taken as finite)."""
    if e == Load(k):
        return Const(0.0)
    if isinstance(e, Red):
        return e
    if isinstance(e, Op):
        args = [_at_zero(a, k) for a in e.args]
        zero = Const(0.0)
        if e.name == "mul" and zero in args:
            return zero
        if e.name in ("neg", "round_bf16", "round_fp16", "trunc", "add", "sub") and all(a == zero for a in args):
            return zero
        if e.name == "div" and args[0] == zero and isinstance(args[1], Const) and args[1].value != 0:
            return zero
        return op(e.name, *args, attrs=e.attrs)
    return rebuild(e, lambda c: _at_zero(c, k))


def find_guard(p: Program) -> int | None:
    """The input whose zeros let a template skip elements of every sum (a padding mask), or None."""
    if not p.is_row or p.more or p.has_totals or p.limit is not None or p.level(p.out) != "row":
        return None
    reds = reductions(p.out)
    if not reds or any(r.kind != "sum" for r in reds):
        return None
    a1 = p.axes[-1] + 1
    for k in range(len(p.inputs)):
        s = p.padded(k)
        if any(s[d] != 1 for d in range(a1, p.ndim)) or not p.load_is_full(k):
            continue
        if all(Load(k) in walk(r.arg) and _at_zero(r.arg, k) == Const(0.0) for r in reds):
            return k
    return None


def inside(p: Program, e: Expr) -> Expr:
    """e as it is before the row's limit: the mask's `where` replaced by its kept branch (a template that stops at the
    limit need not test the mask per element)."""
    if p.kept is None:
        return e
    w, branch = p.kept

    def sub(x: Expr) -> Expr:
        if x == w:
            return branch
        if isinstance(x, Op):  # simplified again (Llama's rounded sum, its mask gone: its score rounded once)
            return op(x.name, *(sub(a) for a in x.args), attrs=x.attrs)
        return rebuild(x, sub)

    return sub(e)
