"""The lowering's state: the values it builds (Val), the inputs it interns, and the helpers every op's lowering
uses (arguments, dims, pointwise ops, reductions into the row space).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod
from typing import Any

from runner.catalog.capture import CGraph, CNode
from runner.catalog.ir import (
    Const,
    Expr,
    Gather,
    Input,
    Iota,
    Load,
    Op,
    Red,
    Total,
    level,
    op,
    reductions,
    walk,
)
from runner.catalog.pattern import (
    Heavy,
    Refusal,
    Unsupported,
    substitute,
)
from runner.catalog.views import Views, contiguous_strides, has_views


@dataclass
class Val:
    expr: Expr
    shape: tuple[int, ...]


@dataclass
class Diag:
    k: int  # input index of the 1-D vector
    n: int


@dataclass
class Transposed:
    """A 2-D input or weight read transposed: only a GEMM may take it (as torch would)."""

    node: CNode


def ref_name(a) -> str:
    return a["ref"] if isinstance(a, dict) and "ref" in a else ""


class Lowering:
    def __init__(self, g: CGraph):
        self.g = g
        self.inputs: list[Input] = []
        self.env: dict[str, Any] = {}
        self.F: tuple[int, ...] | None = None
        self.axes: tuple[int, ...] | None = None
        self.heavy: Heavy | None = None
        self.notes: list[str] = []
        self.row_shapes: set[tuple[int, ...]] = set()
        self.view_loads: set[Load] | None = None  # after a group norm: the only loads F's grouped view can index
        self.views = Views(self.inputs, self.intern, self.plain)
        self.constants_ok = False  # a stage of a KernelBench candidate may read constant tensors (ModelNew passes them)

    def plain(self, inp: Input) -> Load:
        """A view that is the tensor's own contiguous layout (a permute undone) as a plain read again; the caller
        knows the view spans the value's shape (no clamped coordinates)."""
        if inp.strides is not None and inp.terms is None and not any(inp.shift or ()) and inp.offset == 0 \
                and prod(inp.shape) == inp.base and tuple(inp.strides) == contiguous_strides(tuple(inp.shape)):
            return self.load(inp.abi, inp.shape, inp.dtype, viewed=True)
        return self.intern(inp)

    def intern(self, inp: Input) -> Load:
        """The load of an input (a strided view, say), added unless an equal one exists."""
        for k, x in enumerate(self.inputs):
            if x == inp:
                return Load(k)
        self.inputs.append(inp)
        return Load(len(self.inputs) - 1)

    # ---- helpers ---------------------------------------------------------------------------------------------
    def load(self, abi: int, shape, dtype: str, viewed: bool = False) -> Load:
        shape = tuple(int(s) for s in shape)
        for k, inp in enumerate(self.inputs):
            if (inp.abi, inp.shape, inp.viewed, inp.strides) == (abi, shape, viewed, None):
                return Load(k)
        self.inputs.append(Input(abi=abi, shape=shape, dtype=dtype or "float32", viewed=viewed))
        return Load(len(self.inputs) - 1)

    def val(self, a) -> Val:
        if isinstance(a, dict) and "ref" in a:
            v = self.env[a["ref"]]
            if isinstance(v, Transposed):  # a transposed 2-D input read by anything but a GEMM: a strided view
                src = self.val({"ref": v.node.name})
                return self.viewed(lambda: Val(self.views.permute(src.expr, src.shape, [1, 0]), src.shape[::-1]))
            if isinstance(v, Val):
                return v
            if isinstance(v, Refusal):
                raise Unsupported(v.why)
            raise Unsupported(f"{a['ref']} is used where a tensor value is expected")
        if isinstance(a, bool | int | float):
            return Val(Const(float(a)), ())
        raise Unsupported(f"argument {a!r} is not a tensor or a number")

    @staticmethod
    def arg(n: CNode, i: int, name: str, default=None):
        if len(n.args) > i:
            return n.args[i]
        return n.kwargs.get(name, default)

    def dims(self, dim, ndim: int) -> tuple[int, ...]:
        if dim is None:
            return tuple(range(ndim))
        ds = sorted({(d + ndim) % ndim for d in (dim if isinstance(dim, list | tuple) else [dim])})
        if ds != list(range(ds[0], ds[-1] + 1)):
            raise Unsupported(f"reduction over non-contiguous dims {ds}")
        return tuple(ds)

    # ---- reductions ------------------------------------------------------------------------------------------
    def reduce(self, kind: str, x: Val, dims: tuple[int, ...], keepdim: bool) -> Val:
        shape = x.shape
        if not dims:
            dims = tuple(range(len(shape)))
        out_shape = tuple(1 if d in dims else s for d, s in enumerate(shape)) if keepdim else \
            tuple(s for d, s in enumerate(shape) if d not in dims)
        if prod(shape[d] for d in dims) == 1:  # nothing to reduce, whatever came before (a per-row value too)
            what = "zero" if kind in ("argmax", "argmin", "var") else "the identity"
            self.notes.append(f"{kind} over dims of size 1 is {what}")
            if kind in ("argmax", "argmin", "var"):
                return Val(Const(0.0), out_shape)
            if keepdim or reductions(x.expr) or len(out_shape) == len(shape):
                return Val(x.expr, out_shape)
            return Val(self.reshape_loads(x.expr, out_shape), out_shape)
        if self.F is None:
            self.F, self.axes = shape, dims
        elif (self.F, self.axes) != (shape, dims) and self.is_row_space(shape) and \
                all(shape[d] == 1 or d in dims for d in range(len(shape))):
            return self.total(kind, x, out_shape)
        elif (self.F, self.axes) != (shape, dims):
            raise Unsupported(f"reductions over different spaces: {self.F} along {self.axes} and {shape} along {dims}")
        self.row_shapes.add(out_shape)
        self.notes.append(f"{kind} over dims {list(dims)}")
        return Val(Red(kind, x.expr), out_shape)

    def is_row_space(self, shape: tuple[int, ...]) -> bool:
        """Is a shape the program's space of rows: F without its reduced dims, or with them as 1?"""
        assert self.F is not None and self.axes is not None
        rows = tuple(s for d, s in enumerate(self.F) if d not in self.axes)
        kept = tuple(1 if d in self.axes else s for d, s in enumerate(self.F))
        strip = lambda t: tuple(x for x in t if x != 1)  # noqa: E731
        return strip(shape) == strip(rows) and len(shape) in (len(rows), len(kept))

    def total(self, kind: str, x: Val, out_shape: tuple[int, ...]) -> Val:
        """A reduction of a per-row value over every row (a mean of per-row losses): one scalar."""
        assert self.F is not None and self.axes is not None
        if kind not in ("sum", "mean", "max", "min"):
            raise Unsupported(f"{kind} over the rows of a row reduction")
        rows = tuple(s for d, s in enumerate(self.F) if d not in self.axes)
        v = self.to_row_space(x, len(rows)) if len(x.shape) == len(rows) else x
        full = frozenset(k for k in range(len(self.inputs)) if any(self._varies(k, d) for d in self.axes))
        if level(v.expr, full, frozenset(Iota(len(self.F) - 1 - d) for d in self.axes)) == "full":
            raise Unsupported("a reduction over rows of a value that varies inside the row")
        e = Total("sum" if kind == "mean" else kind, v.expr)
        if kind == "mean":
            e = op("div", e, Const(float(prod(rows))))
        self.notes.append(f"{kind} over every row of a per-row value (a reduction of reductions)")
        return Val(e, out_shape)

    def _varies(self, k: int, d: int) -> bool:
        s = self.inputs[k].shape
        assert self.F is not None
        padded = (1,) * (len(self.F) - len(s)) + tuple(s)
        return padded[d] != 1

    # ---- ops ---------------------------------------------------------------------------------------------------
    def pointwise(self, n: CNode, name: str, *vals: Val, attrs: tuple[float, ...] = ()) -> Val:
        if self.view_loads is not None:
            if any(isinstance(x, Load) and x not in self.view_loads for v in vals for x in walk(v.expr)):
                raise Unsupported("a tensor meets a group norm's output (its grouped view is not the tensor's shape)")
        if self.F is not None and self.axes:
            F, axes = self.F, self.axes
            reduced_rank = len(F) - len(axes)
            squeezed = [v for v in vals if reductions(v.expr) and 0 < len(v.shape) == reduced_rank != len(F)]
            if squeezed:  # a per-row value without keepdim: its partners live in the reduced space too
                if any(len(v.shape) == len(F) and any(v.shape[d] != 1 for d in axes) for v in vals):
                    raise Unsupported("a per-row value without keepdim meets a full-size one")
                vals = tuple(self.to_row_space(v, reduced_rank) for v in vals)
        return Val(op(name, *(v.expr for v in vals), attrs=attrs), tuple(n.shape or ()))

    def to_row_space(self, v: Val, reduced_rank: int) -> Val:
        """Loads of a value in the reduced (keepdim=False) space, re-viewed into F-space (1 along the axes)."""
        assert self.F is not None and self.axes is not None
        if reductions(v.expr) or not isinstance(v.expr, Load | Op | Gather):
            return v
        if has_views(v.expr, self.inputs) or any(isinstance(x, Gather) for x in walk(v.expr)):
            a0 = self.axes[0]
            s = (1,) * (reduced_rank - len(v.shape)) + tuple(v.shape)
            view = s[:a0] + (1,) * len(self.axes) + s[a0:]
            return Val(self.viewed(lambda: self.views.resize_ones(v.expr, v.shape, view)), v.shape)
        mapping: dict[Expr, Expr] = {}
        for x in walk(v.expr):
            if isinstance(x, Load):
                inp = self.inputs[x.k]
                s = (1,) * (reduced_rank - len(inp.shape)) + tuple(inp.shape)
                a0 = self.axes[0]
                view = s[:a0] + (1,) * len(self.axes) + s[a0:]
                if prod(view) > 1:
                    mapping[x] = self.load(inp.abi, view, inp.dtype, viewed=True)
        return Val(substitute(v.expr, mapping), v.shape)


class LazyLoad(Val):
    def __init__(self, low: Lowering, n: CNode):  # noqa: D107
        self._low, self._n, self._v = low, n, None

    def _get(self) -> Val:
        if self._v is None:
            n = self._n
            self._v = Val(self._low.load(int(n.index), n.shape or (), n.dtype or "float32"), tuple(n.shape or ()))
        return self._v

    @property
    def expr(self):  # type: ignore[override]
        return self._get().expr

    @property
    def shape(self):  # type: ignore[override]
        return self._get().shape
