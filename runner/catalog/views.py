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
    return replace(inp, shape=(1,) * pad + tuple(inp.shape), strides=(0,) * pad + tuple(inp.strides),
                   shift=(0,) * pad + tuple(inp.shift or (0,) * len(inp.shape)), viewed=True)


def rewrite(e: Expr, on_load: Callable[[Load], Expr], on_iota: Callable[[Iota], Expr], keep_reds: bool = False) -> Expr:
    """e with its loads and index ranges re-viewed; a reduction (a per-row value in the program's own space) is
    kept as it is where only size-1 dims change (keep_reds), and refused otherwise."""
    if isinstance(e, Load):
        return on_load(e)
    if isinstance(e, Iota):
        return on_iota(e)
    if isinstance(e, Red):
        if keep_reds:
            return e
        raise ViewError("a view of a value that holds a reduction")
    if isinstance(e, Op):
        return Op(e.name, tuple(rewrite(a, on_load, on_iota, keep_reds) for a in e.args), e.attrs)
    if isinstance(e, Gather):
        base = on_load(e.base)
        if not isinstance(base, Load):
            raise ViewError("a view of a gather")
        return Gather(base, rewrite(e.index, on_load, on_iota, keep_reds), e.stride)
    return e


class Views:
    """View ops over a lowering's inputs (`inputs`, and `intern(Input) -> Load` to add or reuse one)."""

    def __init__(self, inputs: list[Input], intern: Callable[[Input], Load]):
        self.inputs, self.intern = inputs, intern

    def _map(self, e: Expr, ndim: int, fn: Callable[[Input], Input], iota: Callable[[Iota], Expr],
             keep_reds: bool = False) -> Expr:
        def on_load(ld: Load) -> Expr:
            return self.intern(fn(as_strided(self.inputs[ld.k], ndim)))

        return rewrite(e, on_load, iota, keep_reds)

    def slice(self, e: Expr, shape: tuple[int, ...], dim: int, start: int, step: int, size: int) -> Expr:
        nd = len(shape)
        ed = nd - 1 - dim

        def fn(v: Input) -> Input:
            if v.shape[dim] == 1:
                return v
            if v.shift[dim]:
                raise ViewError("a slice of a concatenation")
            st = list(v.strides)
            sh = list(v.shape)
            off = v.offset + start * st[dim]
            st[dim] *= step
            sh[dim] = size
            return replace(v, shape=tuple(sh), strides=tuple(st), offset=off)

        def iota(x: Iota) -> Expr:
            return op("add", op("mul", x, Const(float(step))), Const(float(start))) if x.e == ed else x

        return self._map(e, nd, fn, iota)

    def permute(self, e: Expr, shape: tuple[int, ...], perm: list[int]) -> Expr:
        nd = len(shape)
        perm = [(p + nd) % nd for p in perm]

        def fn(v: Input) -> Input:
            return replace(v, shape=tuple(v.shape[p] for p in perm), strides=tuple(v.strides[p] for p in perm),
                           shift=tuple(v.shift[p] for p in perm))

        def iota(x: Iota) -> Expr:  # old dim p = perm[new dim q]
            old = nd - 1 - x.e
            return Iota(nd - 1 - perm.index(old))

        return self._map(e, nd, fn, iota)

    def shifted(self, e: Expr, shape: tuple[int, ...], dim: int, start: int) -> Expr:
        nd = len(shape)
        ed = nd - 1 - dim

        def fn(v: Input) -> Input:
            if v.shape[dim] == 1:
                return v
            sh = list(v.shift)
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
            return replace(v, shape=tuple(sh), strides=tuple(st), shift=tuple(sf))

        def iota(x: Iota) -> Expr:
            d = len(old) - 1 - x.e
            if d not in o_dims:
                return Const(0.0)
            return Iota(len(new) - 1 - n_dims[o_dims.index(d)])

        return self._map(e, len(old), fn, iota, keep_reds=True)


def has_views(e: Expr, inputs: list[Input]) -> bool:
    """Does the expression read a strided view or an index range (so contiguous reshapes of it are wrong)?"""
    return any(isinstance(x, Iota) or (isinstance(x, Load) and inputs[x.k].strides is not None) for x in walk(e))
