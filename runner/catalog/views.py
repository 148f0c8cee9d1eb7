"""Index arithmetic inside loads: slices, permutes, concatenations and size-1 dims of values before any reduction.

A value is an expression over loads and index ranges (Iota) in its own shape. A view op rewrites each of its loads
into a strided view of the same memory (runner.catalog.ir.Input: `strides`, `offset`, `shift`), and each Iota into
the coordinate it becomes, so no copy is ever made:

- slice(d, start, step): offset += start * stride[d], stride[d] *= step; Iota along d -> Iota * step + start;
- permute(perm): the view's dims (shape, strides, shift) permuted; Iotas follow their dims;
- cat(pieces, d): piece j (from s_j) reads its loads shifted by s_j along d, clamped inside the piece (the other
  pieces' positions read an element of the piece that `where` then discards), and the value is
  where(Iota_d < s_1, piece_0, where(Iota_d < s_2, piece_1, ...));
- unsqueeze/squeeze: a size-1 dim inserted or removed.
Views are fixed at the captured sizes (the set-up checks each tensor's size).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import replace
from math import prod

from runner.catalog.ir import Const, Expr, Gather, Input, Iota, Load, Op, Red, op, walk


class ViewError(Exception):
    """The view cannot be expressed as index arithmetic on the loads."""


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    out, s = [], 1
    for n in reversed(shape):
        out.append(s if n != 1 else 0)
        s *= n
    return tuple(reversed(out))


def as_strided(inp: Input, ndim: int) -> Input:
    """The input as an explicit strided view padded (on the left) to ndim dims."""
    pad = ndim - len(inp.shape)
    if pad < 0:
        raise ViewError("a load with more dims than its value")
    if inp.strides is None:
        strides = contiguous_strides(inp.shape)
        base = prod(inp.shape)
        return replace(inp, shape=(1,) * pad + tuple(inp.shape), strides=(0,) * pad + strides,
                       shift=(0,) * ndim, base=base, viewed=True)
    terms = None if inp.terms is None else tuple((d + pad, dv, m, st) for d, dv, m, st in inp.terms)
    return replace(inp, shape=(1,) * pad + tuple(inp.shape), strides=(0,) * pad + tuple(inp.strides),
                   shift=(0,) * pad + tuple(inp.shift or (0,) * len(inp.shape)), viewed=True, terms=terms)


def rewrite(e: Expr, on_load: Callable[[Load], Expr], on_iota: Callable[[Iota], Expr], keep_reds: bool = False,
            into_reds: bool = False) -> Expr:
    """e with its loads and index ranges re-viewed; a reduction (a per-row value in the program's own space) is
    kept as it is where only size-1 dims change (keep_reds), re-viewed inside where the whole program's space changes
    with it (into_reds), and refused otherwise."""
    if isinstance(e, Load):
        return on_load(e)
    if isinstance(e, Iota):
        return on_iota(e)
    if isinstance(e, Red):
        if into_reds:
            return Red(e.kind, rewrite(e.arg, on_load, on_iota, keep_reds, into_reds))
        if keep_reds:
            return e
        raise ViewError("a view of a value that holds a reduction")
    if isinstance(e, Op):
        return Op(e.name, tuple(rewrite(a, on_load, on_iota, keep_reds, into_reds) for a in e.args), e.attrs)
    if isinstance(e, Gather):
        base = on_load(e.base)
        if not isinstance(base, Load):
            raise ViewError("a view of a gather")
        return Gather(base, rewrite(e.index, on_load, on_iota, keep_reds, into_reds), e.stride)
    return e


class Views:
    """View ops over a lowering's inputs (`inputs`, and `intern(Input) -> Load` to add or reuse one)."""

    def __init__(self, inputs: list[Input], intern: Callable[[Input], Load], plain: Callable[[Input], Load]):
        """plain(Input): as intern, but a view that is its tensor's contiguous layout becomes a plain read."""
        self.inputs, self.intern, self.plain = inputs, intern, plain

    def _map(self, e: Expr, ndim: int, fn: Callable[[Input], Input], iota: Callable[[Iota], Expr],
             keep_reds: bool = False, into_reds: bool = False, out: tuple[int, ...] | None = None) -> Expr:
        """out: the value's new shape, where a view that spans it may become a plain read."""

        def on_load(ld: Load) -> Expr:
            v = fn(as_strided(self.inputs[ld.k], ndim))
            spans = out is not None and all(s in (1, o) for s, o in zip(v.shape, out, strict=True))
            return self.plain(v) if spans else self.intern(v)

        return rewrite(e, on_load, iota, keep_reds, into_reds)

    def slice(self, e: Expr, shape: tuple[int, ...], dim: int, start: int, step: int, size: int) -> Expr:
        nd = len(shape)
        ed = nd - 1 - dim

        def fn(v: Input) -> Input:
            if v.shape[dim] == 1:
                return v
            if v.terms is not None:
                raise ViewError("a slice of a reshaped view")
            if v.shift[dim]:  # a shifted piece (cat, pad): the slice's start moves the shift, not the offset
                if step != 1:
                    raise ViewError("a strided slice of a concatenation")
                sf = list(v.shift)
                sf[dim] -= start
                return replace(v, shift=tuple(sf))
            st = list(v.strides)
            sh = list(v.shape)
            off = v.offset + start * st[dim]
            st[dim] *= step
            sh[dim] = size
            return replace(v, shape=tuple(sh), strides=tuple(st), offset=off)

        def iota(x: Iota) -> Expr:
            return op("add", op("mul", x, Const(float(step))), Const(float(start))) if x.e == ed else x

        return self._map(e, nd, fn, iota)

    def permute(self, e: Expr, shape: tuple[int, ...], perm: list[int], into_reds: bool = False) -> Expr:
        nd = len(shape)
        perm = [(p + nd) % nd for p in perm]

        def fn(v: Input) -> Input:
            terms = None if v.terms is None else tuple((perm.index(d), dv, m, st) for d, dv, m, st in v.terms)
            return replace(v, shape=tuple(v.shape[p] for p in perm), strides=tuple(v.strides[p] for p in perm),
                           shift=tuple(v.shift[p] for p in perm), terms=terms)

        def iota(x: Iota) -> Expr:  # old dim p = perm[new dim q]
            old = nd - 1 - x.e
            return Iota(nd - 1 - perm.index(old))

        return self._map(e, nd, fn, iota, into_reds=into_reds, out=tuple(shape[p] for p in perm))

    def shifted(self, e: Expr, shape: tuple[int, ...], dim: int, start: int) -> Expr:
        nd = len(shape)
        ed = nd - 1 - dim

        def fn(v: Input) -> Input:
            if v.shape[dim] == 1:
                return v
            sh = list(v.shift)  # (a reshaped view's coordinate is shifted before its terms: fb_tidx)
            sh[dim] += start
            return replace(v, shift=tuple(sh))

        def iota(x: Iota) -> Expr:
            return op("sub", x, Const(float(start))) if x.e == ed else x

        return self._map(e, nd, fn, iota)

    def cat(self, pieces: list[tuple[Expr, tuple[int, ...]]], dim: int, shape: tuple[int, ...]) -> Expr:
        nd = len(shape)
        starts, s = [], 0
        for _, sh in pieces:
            starts.append(s)
            s += sh[dim]
        out: Expr | None = None
        for (e, sh), st in reversed(list(zip(pieces, starts, strict=True))):
            if len(sh) != nd:
                raise ViewError("a concatenation of values of different ranks")
            v = self.shifted(e, sh, dim, st)
            inside = op("lt", Iota(nd - 1 - dim), Const(float(st + sh[dim])))
            out = v if out is None else op("where", inside, v, out)
        assert out is not None
        return out

    def reshape(self, e: Expr, old: tuple[int, ...], new: tuple[int, ...]) -> Expr:
        """Dims merged or split (a view of a sliced tensor as rows): each load's index as terms."""
        if [x for x in old if x != 1] == [x for x in new if x != 1]:
            return self.resize_ones(e, old, new)
        def on_load(ld: Load) -> Expr:
            v = as_strided(self.inputs[ld.k], len(old))
            return self.intern(reshape_terms(v, old, new))

        def on_iota(x: Iota) -> Expr:  # the old coordinate from the new ones, by the same terms as a load's
            d = len(old) - 1 - x.e
            probe = Input(abi=0, shape=old, dtype="float32", strides=tuple(int(i == d) for i in range(len(old))),
                          shift=(0,) * len(old))
            out: Expr = Const(0.0)
            for (nd_, div, mod, st) in reshape_terms(probe, old, new).terms or ():
                c = op("idivmod", Iota(len(new) - 1 - nd_), attrs=(float(div), float(mod)))
                out = op("add", out, op("mul", c, Const(float(st))))
            return out

        return rewrite(e, on_load, on_iota)

    def repeat(self, e: Expr, old: tuple[int, ...], new: tuple[int, ...]) -> Expr:
        """x.repeat(reps) (reps as long as x's dims): each coordinate wraps modulo x's own size (a term's mod)."""
        pad = len(new) - len(old)
        e = self.resize_ones(e, old, (1,) * pad + tuple(old)) if pad else e
        old = (1,) * pad + tuple(old)

        def on_load(ld: Load) -> Expr:
            v = as_strided(self.inputs[ld.k], len(old))
            terms = _terms(v)
            spans = {t[0] for t in terms}
            shape = tuple(n if d in spans else 1 for d, n in enumerate(new))
            return self.intern(replace(v, shape=shape, strides=(0,) * len(new), shift=(0,) * len(new),
                                       terms=tuple(terms)))

        def on_iota(x: Iota) -> Expr:
            d = len(old) - 1 - x.e
            return op("idivmod", x, attrs=(1.0, float(old[d])))

        return rewrite(e, on_load, on_iota)

    def pad(self, e: Expr, shape: tuple[int, ...], pads: list[int], value: float, out: tuple[int, ...]) -> Expr:
        """constant_pad_nd: pads (lo, hi) per dim from the last; inside, the value shifted by lo; outside, value."""
        nd = len(shape)
        inside: Expr | None = None
        for j in range(len(pads) // 2):
            lo, hi = pads[2 * j], pads[2 * j + 1]
            d = nd - 1 - j
            if lo < 0 or hi < 0:
                raise ViewError("a negative pad (a crop)")
            if lo == 0 and hi == 0:
                continue
            e = self.shifted(e, shape, d, lo)
            c = Iota(nd - 1 - d)
            ok = op("mul", op("ge", c, Const(float(lo))), op("lt", c, Const(float(lo + shape[d]))))
            inside = ok if inside is None else op("mul", inside, ok)
        return e if inside is None else op("where", inside, e, Const(float(value)))

    def resize_ones(self, e: Expr, old: tuple[int, ...], new: tuple[int, ...]) -> Expr:
        """Size-1 dims inserted or removed (unsqueeze, squeeze, a view that only does that)."""
        if [x for x in old if x != 1] != [x for x in new if x != 1]:
            raise ViewError(f"a view from {list(old)} to {list(new)}")
        o_dims = [d for d, x in enumerate(old) if x != 1]
        n_dims = [d for d, x in enumerate(new) if x != 1]

        def fn(v: Input) -> Input:
            sh, st, sf = [1] * len(new), [0] * len(new), [0] * len(new)
            for a, b in zip(o_dims, n_dims, strict=True):
                sh[b], st[b], sf[b] = v.shape[a], v.strides[a], v.shift[a]
            terms = None if v.terms is None else tuple(
                (n_dims[o_dims.index(d)], dv, m, s) for d, dv, m, s in v.terms)
            return replace(v, shape=tuple(sh), strides=tuple(st), shift=tuple(sf), terms=terms)

        def iota(x: Iota) -> Expr:
            d = len(old) - 1 - x.e
            if d not in o_dims:
                return Const(0.0)
            return Iota(len(new) - 1 - n_dims[o_dims.index(d)])

        return self._map(e, len(old), fn, iota, keep_reds=True)


def _terms(v: Input) -> list[tuple[int, int, int, int]]:
    """A view's index as terms (dim, div, mod, stride)."""
    if any(v.shift or ()):
        raise ViewError("a reshape of a concatenation")
    if v.terms is not None:
        return list(v.terms)
    return [(d, 1, n, st) for d, (n, st) in enumerate(zip(v.shape, v.strides, strict=True)) if n != 1]


def reshape_terms(v: Input, old: tuple[int, ...], new: tuple[int, ...]) -> Input:
    """v (a strided view of a value of shape old) as a view of the value reshaped to new (row-major)."""
    blocks, i, j = [], 0, 0  # runs of old dims and new dims of equal product
    while i < len(old) or j < len(new):
        bi, bj = [i], [j]
        po, pn = old[i] if i < len(old) else 1, new[j] if j < len(new) else 1
        i, j = i + 1, j + 1
        while po != pn:
            if po < pn:
                po *= old[i]
                bi.append(i)
                i += 1
            else:
                pn *= new[j]
                bj.append(j)
                j += 1
        blocks.append(([x for x in bi if x < len(old)], [x for x in bj if x < len(new)]))
    out: list[tuple[int, int, int, int]] = []
    by_dim: dict[int, list[tuple[int, int, int, int]]] = {}
    for t in _terms(v):
        by_dim.setdefault(t[0], []).append(t)
    for bo, bn in blocks:
        bo = [d for d in bo if old[d] != 1]
        bn = [d for d in bn if new[d] != 1]
        if not bo:
            continue
        if len(bn) == 1:  # old dims merged into one: c_old = (c_new // (product of the old dims after it)) % size
            after = 1
            for d in reversed(bo):
                for (_, div, mod, st) in by_dim.get(d, []):
                    out.append((bn[0], after * div, mod, st))
                after *= old[d]
        elif len(bo) == 1:  # one old dim split: c_old = sum of c_new[k] * (product of the new dims after k)
            terms = by_dim.get(bo[0], [])
            if any(div != 1 or mod != old[bo[0]] for (_, div, mod, _) in terms):
                raise ViewError("a split of a dim already merged")
            after = 1
            for d in reversed(bn):
                for (_, _, _, st) in terms:
                    out.append((d, 1, new[d], st * after))
                after *= new[d]
        else:
            raise ViewError(f"a reshape from {list(old)} to {list(new)} that mixes dims")
    spans = {t[0] for t in out}  # a dim no term reads is a broadcast of the view (size 1)
    shape = tuple(n if d in spans else 1 for d, n in enumerate(new))
    return replace(v, shape=shape, strides=(0,) * len(new), shift=(0,) * len(new), terms=tuple(out))


def has_views(e: Expr, inputs: list[Input]) -> bool:
    """Does the expression read a strided view or an index range (so contiguous reshapes of it are wrong)?"""
    return any(isinstance(x, Iota) or (isinstance(x, Load) and inputs[x.k].strides is not None) for x in walk(e))
