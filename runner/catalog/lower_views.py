"""Lowering of view and layout ops: slices, gathers, cat/split, permute/transpose and reshapes.
"""

from __future__ import annotations

from dataclasses import replace
from math import prod
from typing import Any

from runner.catalog.capture import CNode
from runner.catalog.ir import (
    Const,
    Expr,
    Gather,
    Load,
    reductions,
    walk,
)
from runner.catalog.lowering import LazyLoad, Lowering, Transposed, Val, ref_name
from runner.catalog.pattern import (
    Unsupported,
    in_red,
    substitute,
)
from runner.catalog.views import ViewError, as_strided, has_views


class ViewOps(Lowering):
    def lower_slice(self, n: CNode) -> Val:
        """A slice: its loads read a strided view, its index ranges shift (a causal mask's window)."""
        x = self.val(n.args[0])
        shape = tuple(n.shape or ())
        nd = len(x.shape)
        dim = (int(self.arg(n, 1, "dim", 0)) + nd) % nd
        start = int(self.arg(n, 2, "start", 0) or 0)
        step = int(self.arg(n, 4, "step", 1) or 1)
        start = max(start + x.shape[dim], 0) if start < 0 else min(start, x.shape[dim])
        if shape == x.shape:
            return x
        self.notes.append("a slice read in place (index arithmetic in the load)")
        return self.viewed(lambda: Val(self.views.slice(x.expr, x.shape, dim, start, step, shape[dim]), shape))

    def lower_select(self, n: CNode) -> Val:
        """x.select(dim, i) (x[..., i], a pair of an interleaved rotary embedding): a slice of one element along dim,
        that dim dropped."""
        x = self.val(n.args[0])
        nd = len(x.shape)
        dim = (int(self.arg(n, 1, "dim", 0)) + nd) % nd
        i = int(self.arg(n, 2, "index", 0))
        i = i + x.shape[dim] if i < 0 else i
        one = x.shape[:dim] + (1,) + x.shape[dim + 1:]
        shape = tuple(n.shape or ())
        e = x.expr if x.shape[dim] == 1 else self.viewed(lambda: self.views.slice(x.expr, x.shape, dim, i, 1, 1))
        self.notes.append("an element along a dim read in place (select: index arithmetic in the load)")
        return Val(self.viewed(lambda: self.views.resize_ones(e, one, shape)), shape)

    def gather_view(self, ld: Load, ndim: int, dim: int) -> Gather | Load:
        """Load ld (a tensor padded to ndim dims) read with its coordinate along dim taken from an index later:
        a view of size 1 along dim, and that dim's stride."""
        v = as_strided(self.inputs[ld.k], ndim)
        if v.shape[dim] == 1:
            return ld
        sh, st = list(v.shape), list(v.strides)
        terms = v.terms
        if terms is not None:  # a reshaped view: the gathered dim must be one plain term
            mine = [t for t in terms if t[0] == dim]
            if len(mine) != 1 or mine[0][1] != 1:
                raise Unsupported("a gather along a merged dim")
            stride, terms = mine[0][3], tuple(t for t in terms if t[0] != dim)
        else:
            stride = v.strides[dim]
        sh[dim], st[dim] = 1, 0
        return Gather(self.intern(replace(v, shape=tuple(sh), strides=tuple(st), terms=terms)), Const(0.0), stride)

    def lower_gather(self, n: CNode, o: str) -> Val:
        """embedding(W, ids), index_select(x, d, idx), gather(x, d, idx): loads with an index read from a tensor."""
        shape = tuple(n.shape or ())
        nd = len(shape)
        if o in ("embedding", "index0"):  # out = idx.shape + src.shape[1:]
            src, idx = self.val(n.args[0]), self.val(n.args[1])
            dim = nd - len(src.shape)
            index = self.to_space(idx, idx.shape + (1,) * (len(src.shape) - 1))
        elif o == "index_select":
            src, dim, idx = self.val(n.args[0]), int(n.args[1]) % nd, self.val(n.args[2])
            index = self.to_space(idx, idx.shape + (1,) * (nd - 1 - dim))
        else:
            src, dim, idx = self.val(n.args[0]), int(n.args[1]) % nd, self.val(n.args[2])
            index = idx.expr
        if o != "gather" and not isinstance(src.expr, Load):
            raise Unsupported(f"{o} of a computed tensor")
        if o == "gather" and reductions(src.expr) and (self.axes != (dim,) or src.shape != self.F):
            raise Unsupported("a gather across a reduction's rows")
        mapping: dict[Expr, Expr] = {}
        for ld in {x for x in walk(src.expr) if isinstance(x, Load)}:  # (substitute leaves a Red's own loads)
            g = self.gather_view(ld, max(nd, len(src.shape)), dim + max(nd, len(src.shape)) - nd)
            mapping[ld] = g if isinstance(g, Load) else Gather(g.base, index, g.stride)
        self.notes.append(f"{o}: loads indexed by a tensor's values")
        return Val(substitute(src.expr, mapping), shape)

    def to_space(self, v: Val, shape: tuple[int, ...]) -> Expr:
        """v's expression re-viewed to a shape that only adds or drops size-1 dims."""
        if has_views(v.expr, self.inputs):
            return self.viewed(lambda: self.views.resize_ones(v.expr, v.shape, shape))
        return self.reshape_loads(v.expr, shape)

    def lower_cat(self, n: CNode) -> Val:
        vals = [self.val(r) for r in n.args[0]]
        shape = tuple(n.shape or ())
        dim = (int(self.arg(n, 1, "dim", 0)) + len(shape)) % len(shape)
        self.notes.append("a concatenation read in place (each piece's loads shifted, selected by position)")
        return self.viewed(lambda: Val(self.views.cat([(v.expr, v.shape) for v in vals], dim, shape), shape))

    def lower_split(self, n: CNode) -> tuple:
        x = self.val(n.args[0])
        nd = len(x.shape)
        sizes = n.args[1]
        dim = (int(self.arg(n, 2, "dim", 0)) + nd) % nd
        if isinstance(sizes, int):
            sizes = [min(sizes, x.shape[dim] - s) for s in range(0, x.shape[dim], sizes)]
        out, start = [], 0
        for size in sizes:
            shape = x.shape[:dim] + (size,) + x.shape[dim + 1:]
            e = self.viewed(lambda st=start, sz=size: self.views.slice(x.expr, x.shape, dim, st, 1, sz))
            out.append(Val(e, shape))
            start += size
        self.notes.append("a split read in place (index arithmetic in the load)")
        return tuple(out)

    def lower_permute(self, n: CNode) -> Val:
        x = self.val(n.args[0])
        nd = len(x.shape)
        if n.op == "permute":
            perm = list(n.args[1])
        else:
            perm = list(range(nd))
            d0, d1 = ((0, 1) if n.op == "t" else (int(n.args[1]) % nd, int(n.args[2]) % nd))
            perm[d0], perm[d1] = perm[d1], perm[d0]
        shape = tuple(x.shape[p % nd] for p in perm)
        if reductions(x.expr) and self.F is not None and x.shape == self.F and self.only_output(n):
            return self.permute_program(x, [p % nd for p in perm], shape)
        self.notes.append("a permute read in place (strides in the load)")
        return self.viewed(lambda: Val(self.views.permute(x.expr, x.shape, perm), shape))

    def only_output(self, n: CNode) -> bool:
        """Is node n read by the graph's output alone (through views to it at most)?"""
        users = [m for m in self.g.nodes if n.name in str(m.args)]
        return bool(users) and all(m.op == "output" for m in users)

    def permute_program(self, x: Val, perm: list[int], shape: tuple[int, ...]) -> Val:
        """The output permuted (a channels-first LayerNorm permuted back): the whole program's space permutes, its
        reduced dims with it, and every load (inside the reductions too) reads through the permuted view."""
        assert self.F is not None and self.axes is not None
        axes = tuple(sorted(perm.index(a) for a in self.axes))
        if list(axes) != list(range(axes[0], axes[-1] + 1)):
            raise Unsupported("a permute that splits the reduced dims")
        e = self.viewed(lambda: self.views.permute(x.expr, x.shape, perm, into_reds=True))
        self.F, self.axes = shape, axes
        self.notes.append("the output permuted: the program's space permuted with it (reduced dims included)")
        return Val(e, shape)

    def lower_getattr(self, n: CNode) -> Any:
        src, attr = self.env.get(ref_name(n.args[0])), n.args[1]
        if isinstance(src, tuple) and attr in ("values", "indices"):
            return src[0 if attr == "values" else 1]
        if attr in ("T", "mT") and isinstance(src, LazyLoad) and len(src._n.shape or ()) == 2:
            return Transposed(src._n)
        raise Unsupported(f"attribute {attr!r} of a value")

    def lower_transpose(self, n: CNode) -> Any:
        src = self.env[ref_name(n.args[0])]
        dims = [a for x in n.args[1:] for a in (x if isinstance(x, list) else [x]) if isinstance(a, int)]
        if len(src._n.shape or ()) == 2 and (n.op == "t" or sorted(dims) == [0, 1] or dims == [-1, -2]
                                              or dims == [-2, -1]):
            return Transposed(src._n)
        return self.lower_permute(n)

    def viewed(self, fn) -> Any:
        try:
            return fn()
        except ViewError as e:
            raise Unsupported(str(e)) from None

    def lower_view(self, n: CNode) -> Val:
        x = self.val(n.args[0])
        shape = tuple(n.shape or ())
        if n.op in ("expand", "expand_as"):
            return Val(x.expr, shape)
        if prod(shape) != prod(x.shape):
            raise Unsupported(f"{n.op} changes the number of elements")
        if shape == x.shape:
            return x
        if reductions(x.expr) and self.F is not None and self.is_row_space(x.shape) and self.is_row_space(shape):
            return Val(x.expr, shape)  # a per-row value: its loads already index the program's space
        if has_views(x.expr, self.inputs):
            return self.viewed(lambda: Val(self.views.reshape(x.expr, x.shape, shape), shape))
        if isinstance(x.expr, Load):
            inp = self.inputs[x.expr.k]
            if prod(inp.shape) == prod(shape):
                return Val(self.load(inp.abi, shape, inp.dtype, viewed=True), shape)
        if [s for s in shape if s != 1] == [s for s in x.shape if s != 1]:
            # a size-1 dim added or dropped: only loads need a new view, a reduction keeps its row
            try:
                return Val(self.reshape_loads(x.expr, shape), shape)
            except Unsupported:
                if reductions(x.expr):
                    raise
        if not reductions(x.expr):  # dims merged or split: each load's index as terms
            return self.viewed(lambda: Val(self.views.reshape(x.expr, x.shape, shape), shape))
        raise Unsupported(f"{n.op} of a computed tensor from {list(x.shape)} to {list(shape)}")

    def reshape_loads(self, e: Expr, shape: tuple[int, ...]) -> Expr:
        loads = [x for x in walk(e) if isinstance(x, Load)]
        if any(prod(self.inputs[x.k].shape) not in (1, prod(shape)) for x in loads if not in_red(e, x)):
            raise Unsupported("a view of an expression over inputs of different shapes")
        mapping = {x: self.load(self.inputs[x.k].abi, shape, self.inputs[x.k].dtype, viewed=True)
                   for x in loads if prod(self.inputs[x.k].shape) == prod(shape) and prod(shape) > 1}
        return substitute(e, mapping)
