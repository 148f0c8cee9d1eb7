"""Recognise a captured graph (runner.catalog.capture) as one of the catalog's pattern families.

- elementwise: a chain of pointwise ops over any number of broadcast inputs (and constant or identity shortcuts);
- row: reductions and normalisations along one block of contiguous dims (sum, mean, max, min, argmax, argmin,
  logsumexp, softmax, log-softmax, layer/instance/RMS norm, L1/L2/Frobenius norms, MSE/L1/Huber/KL losses),
  with any pointwise prologue and epilogue;
- epilogue: one GEMM / batched GEMM / convolution on the forward's inputs and weights, followed by a program as above
  (the heavy op stays on torch, the rest becomes one kernel);
- unsupported: with the reason.

Algebraic shortcuts are applied while lowering: diag(a) @ B is a broadcast multiply, x*1 / x+0 / x-x fold, and a
reduction over dims of size 1 is the identity (so softmax over them is the constant 1).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from math import prod
from typing import Any

from runner.catalog import schedule, skipping
from runner.catalog.capture import ARANGE, TRIL, CGraph, CNode
from runner.catalog.ir import (
    Const,
    Dim,
    Expr,
    Gather,
    Input,
    Iota,
    Load,
    Op,
    Output,
    Program,
    Red,
    Total,
    level,
    op,
    rebuild,
    reductions,
    walk,
)
from runner.catalog.opset import translate
from runner.catalog.views import ViewError, Views, as_strided, contiguous_strides, has_views

HEAVY = {"linear", "matmul", "conv1d", "conv2d", "conv3d", "convtranspose2d", "convtranspose3d", "addmm", "einsum"}
IDENTITY = {"identity", "contiguous", "clone", "dropout", "detach", "float", "type_as"}
HALF = {"bfloat16": "round_bf16", "float16": "round_fp16"}  # the op that rounds a float to the type


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
class _Val:
    expr: Expr
    shape: tuple[int, ...]


@dataclass
class _Diag:
    k: int  # input index of the 1-D vector
    n: int


class _Lower:
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

    def val(self, a) -> _Val:
        if isinstance(a, dict) and "ref" in a:
            v = self.env[a["ref"]]
            if isinstance(v, _Transposed):  # a transposed 2-D input read by anything but a GEMM: a strided view
                src = self.val({"ref": v.node.name})
                return self.viewed(lambda: _Val(self.views.permute(src.expr, src.shape, [1, 0]), src.shape[::-1]))
            if isinstance(v, _Val):
                return v
            if isinstance(v, Refusal):
                raise Unsupported(v.why)
            raise Unsupported(f"{a['ref']} is used where a tensor value is expected")
        if isinstance(a, bool | int | float):
            return _Val(Const(float(a)), ())
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
    def reduce(self, kind: str, x: _Val, dims: tuple[int, ...], keepdim: bool) -> _Val:
        shape = x.shape
        if not dims:
            dims = tuple(range(len(shape)))
        out_shape = tuple(1 if d in dims else s for d, s in enumerate(shape)) if keepdim else \
            tuple(s for d, s in enumerate(shape) if d not in dims)
        if prod(shape[d] for d in dims) == 1:  # nothing to reduce, whatever came before (a per-row value too)
            what = "zero" if kind in ("argmax", "argmin", "var") else "the identity"
            self.notes.append(f"{kind} over dims of size 1 is {what}")
            if kind in ("argmax", "argmin", "var"):
                return _Val(Const(0.0), out_shape)
            if keepdim or reductions(x.expr) or len(out_shape) == len(shape):
                return _Val(x.expr, out_shape)
            return _Val(self.reshape_loads(x.expr, out_shape), out_shape)
        if self.F is None:
            self.F, self.axes = shape, dims
        elif (self.F, self.axes) != (shape, dims) and self.is_row_space(shape) and \
                all(shape[d] == 1 or d in dims for d in range(len(shape))):
            return self.total(kind, x, out_shape)
        elif (self.F, self.axes) != (shape, dims):
            raise Unsupported(f"reductions over different spaces: {self.F} along {self.axes} and {shape} along {dims}")
        self.row_shapes.add(out_shape)
        self.notes.append(f"{kind} over dims {list(dims)}")
        return _Val(Red(kind, x.expr), out_shape)

    def is_row_space(self, shape: tuple[int, ...]) -> bool:
        """Is a shape the program's space of rows: F without its reduced dims, or with them as 1?"""
        assert self.F is not None and self.axes is not None
        rows = tuple(s for d, s in enumerate(self.F) if d not in self.axes)
        kept = tuple(1 if d in self.axes else s for d, s in enumerate(self.F))
        strip = lambda t: tuple(x for x in t if x != 1)  # noqa: E731
        return strip(shape) == strip(rows) and len(shape) in (len(rows), len(kept))

    def total(self, kind: str, x: _Val, out_shape: tuple[int, ...]) -> _Val:
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
        return _Val(e, out_shape)

    def _varies(self, k: int, d: int) -> bool:
        s = self.inputs[k].shape
        assert self.F is not None
        padded = (1,) * (len(self.F) - len(s)) + tuple(s)
        return padded[d] != 1

    # ---- ops ---------------------------------------------------------------------------------------------------
    def pointwise(self, n: CNode, name: str, *vals: _Val, attrs: tuple[float, ...] = ()) -> _Val:
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
        return _Val(op(name, *(v.expr for v in vals), attrs=attrs), tuple(n.shape or ()))

    def to_row_space(self, v: _Val, reduced_rank: int) -> _Val:
        """Loads of a value in the reduced (keepdim=False) space, re-viewed into F-space (1 along the axes)."""
        assert self.F is not None and self.axes is not None
        if reductions(v.expr) or not isinstance(v.expr, Load | Op | Gather):
            return v
        if has_views(v.expr, self.inputs) or any(isinstance(x, Gather) for x in walk(v.expr)):
            a0 = self.axes[0]
            s = (1,) * (reduced_rank - len(v.shape)) + tuple(v.shape)
            view = s[:a0] + (1,) * len(self.axes) + s[a0:]
            return _Val(self.viewed(lambda: self.views.resize_ones(v.expr, v.shape, view)), v.shape)
        mapping: dict[Expr, Expr] = {}
        for x in walk(v.expr):
            if isinstance(x, Load):
                inp = self.inputs[x.k]
                s = (1,) * (reduced_rank - len(inp.shape)) + tuple(inp.shape)
                a0 = self.axes[0]
                view = s[:a0] + (1,) * len(self.axes) + s[a0:]
                if prod(view) > 1:
                    mapping[x] = self.load(inp.abi, view, inp.dtype, viewed=True)
        return _Val(substitute(v.expr, mapping), v.shape)

    def lower_node(self, n: CNode) -> Any:  # noqa: C901 - one table of ops
        o = n.op
        a = lambda i, name, d=None: self.arg(n, i, name, d)  # noqa: E731
        if o in ("input", "param", "constant_tensor") and n.kwargs.get("structure") == ARANGE:
            self.notes.append(f"{n.kwargs.get('target')} is 0, 1, 2, ... along its last dim: read as the index")
            return _Val(Iota(0), tuple(n.shape or ()))
        if o in ("input", "param", "constant_tensor") and n.kwargs.get("structure") == TRIL:
            self.notes.append(f"{n.kwargs.get('target')} is a causal (lower-triangular) mask: read as col <= row")
            return _Val(op("le", Iota(0), Iota(1)), tuple(n.shape or ()))
        if o in ("input", "param"):
            return _Val(self.load(int(n.index), n.shape or (), n.dtype or "float32"), tuple(n.shape or ()))
        if o == "const" or (o == "tensor" and isinstance(a(0, "data"), int | float)):
            return _Val(Const(float(n.args[0])), tuple(n.shape or ()))
        if o == "getattr":
            return self.lower_getattr(n)
        if o in ("t", "transpose", "permute") and isinstance(self.env.get(_ref(n.args[0])), _LazyLoad):
            return self.lower_transpose(n)
        if o in IDENTITY or (o == "to" and n.dtype == self.val(a(0, "input")).expr and False):
            return self.env[n.args[0]["ref"]] if isinstance(n.args[0], dict) else self.val(n.args[0])
        if o in HEAVY:
            return self.lower_heavy(n)
        if o == "diag":
            x = self.val(a(0, "input"))
            if len(x.shape) == 1 and isinstance(x.expr, Load) and not a(1, "diagonal", 0):
                return _Diag(x.expr.k, x.shape[0])
            raise Unsupported("diag of a matrix or of a computed vector")
        if o in ("add", "sub", "mul", "div", "maximum", "minimum", "max_binary"):
            x, y = self.val(a(0, "input")), self.val(a(1, "other"))
            if o == "div" and n.kwargs.get("rounding_mode"):
                raise Unsupported("integer division")
            alpha = n.kwargs.get("alpha")
            if alpha is not None and o in ("add", "sub"):
                y = _Val(op("mul", y.expr, Const(float(alpha))), y.shape)
            return self.pointwise(n, o, x, y)
        if o in ("rsub",):
            x, y = self.val(a(0, "input")), self.val(a(1, "other"))
            return self.pointwise(n, "sub", y, x)
        if o == "pow":
            x, e = a(0, "input"), a(1, "exponent")
            if isinstance(e, int | float):
                return self.pointwise(n, "powc", self.val(x), attrs=(float(e),))
            if isinstance(x, int | float) and x > 0:
                return _Val(op("exp", op("mul", Const(math.log(x)), self.val(e).expr)), tuple(n.shape or ()))
            return self.pointwise(n, "pow", self.val(x), self.val(e))
        simple = {"relu": "relu", "sigmoid": "sigmoid", "tanh": "tanh", "exp": "exp", "log": "log", "abs": "abs",
                  "sqrt": "sqrt", "rsqrt": "rsqrt", "erf": "erf", "neg": "neg", "square": "square", "silu": "silu",
                  "mish": "mish", "softsign": "softsign", "hardsigmoid": "hardsigmoid", "hardswish": "hardswish",
                  "log1p": "log1p", "sign": "sign", "reciprocal": "recip", "selu": "selu", "cos": "cos", "sin": "sin"}
        if o in simple:
            return self.pointwise(n, simple[o], self.val(a(0, "input")))
        if o == "gelu":
            approx = n.kwargs.get("approximate", "none")
            return self.pointwise(n, "gelu_tanh" if approx == "tanh" else "gelu", self.val(a(0, "input")))
        if o == "leaky_relu":
            return self.pointwise(n, "leaky_relu", self.val(a(0, "input")),
                                  attrs=(float(a(1, "negative_slope", 0.01)),))
        if o in ("hardtanh", "relu6"):
            lo, hi = (0.0, 6.0) if o == "relu6" else (float(a(1, "min_val", -1.0)), float(a(2, "max_val", 1.0)))
            return _Val(op("clamp_max", op("clamp_min", self.val(a(0, "input")).expr, attrs=(lo,)), attrs=(hi,)),
                        tuple(n.shape or ()))
        if o in ("clamp", "clamp_min", "clamp_max"):
            lo = a(1, "min") if o != "clamp_max" else None
            hi = a(2, "max") if o == "clamp" else (a(1, "max") if o == "clamp_max" else None)
            e = self.val(a(0, "input")).expr
            for bound, name in ((lo, "clamp_min"), (hi, "clamp_max")):
                if isinstance(bound, dict):
                    raise Unsupported("clamp with tensor bounds")
                if bound is not None:
                    e = op(name, e, attrs=(float(bound),))
            return _Val(e, tuple(n.shape or ()))
        if o == "elu":
            return self.pointwise(n, "elu", self.val(a(0, "input")), attrs=(float(a(1, "alpha", 1.0)),))
        if o == "softplus":
            return self.pointwise(n, "softplus", self.val(a(0, "input")),
                                  attrs=(float(a(1, "beta", 1.0)), float(a(2, "threshold", 20.0))))
        if o in ("view", "reshape", "unsqueeze", "squeeze", "flatten", "expand", "expand_as"):
            return self.lower_view(n)
        if o in ("sum", "mean", "amax", "amin", "logsumexp", "argmax", "argmin", "max", "min", "var", "std", "norm",
                 "prod", "linalg_norm", "linalg_vector_norm", "normalize"):
            return self.lower_reduction(n)
        if o == "getitem":
            src = self.env[n.args[0]["ref"]]
            if isinstance(src, tuple):
                return src[int(n.args[1])]
            raise Unsupported("indexing a tensor")
        if o in ("softmax", "log_softmax"):
            x = self.val(a(0, "input"))
            d = self.dims(a(1, "dim"), len(x.shape))
            lse = self.reduce("lse", x, d, True)
            self.notes.append(f"{o} along dim {d[0]} (one log-sum-exp per row)")
            e = op("sub", x.expr, lse.expr)
            return _Val(e if o == "log_softmax" else op("exp", e), x.shape)
        if o == "layer_norm":
            return self.lower_layer_norm(n)
        if o == "instance_norm":
            return self.lower_instance_norm(n)
        if o == "group_norm":
            return self.lower_group_norm(n)
        if o == "batch_norm":
            return self.lower_batch_norm(n)
        if o in ("mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "kl_div"):
            return self.lower_loss(n)
        return self.lower_aten(n, o)

    def lower_aten(self, n: CNode, o: str) -> Any:  # noqa: C901 - one table of ops
        """Ops that only the core-ATen op set has: conversions, masks, comparisons, constants, index ranges and the
        normalisations' tuple forms."""
        a = lambda i, name, d=None: self.arg(n, i, name, d)  # noqa: E731
        shape = tuple(n.shape or ())
        if o in ("layer_norm_t", "group_norm_t", "batch_norm_t", "batch_stats_norm_t"):
            fn = {"layer_norm_t": self.lower_layer_norm, "group_norm_t": self.lower_group_norm,
                  "batch_norm_t": self.lower_batch_norm, "batch_stats_norm_t": self.lower_batch_stats}[o]
            return (fn(n), None, None)
        if o == "to_dtype":
            x = self.val(a(0, "input"))
            src = self.g.node(n.args[0]["ref"]).dtype if isinstance(n.args[0], dict) else "float32"
            dst = n.kwargs.get("dtype") or n.dtype or src
            if dst == src or dst in ("float32", "float64") or src in ("bool",) or not _is_float(src):
                return x
            if dst in HALF:
                self.notes.append(f"rounded to {dst} where the reference converts")
                return _Val(op(HALF[dst], x.expr), x.shape)
            if dst == "bool":
                return _Val(op("ne", x.expr, Const(0.0)), x.shape)
            return _Val(op("trunc", x.expr), x.shape)
        if o == "where":
            return self.pointwise(n, "where", self.val(a(0, "condition")), self.val(a(1, "self")),
                                  self.val(a(2, "other")))
        if o in ("eq", "ne", "lt", "le", "gt", "ge"):
            return self.pointwise(n, o, self.val(a(0, "self")), self.val(a(1, "other")))
        if o == "refuse":
            raise Unsupported(n.kwargs["why"])
        if o in ("not", "expm1", "trunc", "isnan", "isinf"):
            return self.pointwise(n, o, self.val(a(0, "self")))
        if o == "const":
            return _Val(Const(float(a(0, "s"))), shape)
        if o == "full":
            return _Val(Const(float(a(1, "fill_value"))), shape)
        if o in ("full_like", "zeros_like", "ones_like"):
            v = {"zeros_like": 0.0, "ones_like": 1.0}.get(o)
            return _Val(Const(float(a(1, "fill_value")) if v is None else v), shape)
        if o == "arange":
            nums = [x for x in n.args if isinstance(x, int | float)]
            start, step = (0, 1) if len(nums) < 2 else (nums[0], nums[2] if len(nums) > 2 else 1)
            return _Val(op("add", op("mul", Iota(0), Const(float(step))), Const(float(start))), shape)
        if o == "var_mean":
            x = self.val(a(0, "input"))
            var = self.lower_reduction(n.model_copy(update={"op": "var"}))
            mean = self.reduce("mean", x, self.dims(a(1, "dim"), len(x.shape)), bool(a(2, "keepdim", False)))
            return (var, mean)
        if o == "constant_tensor" and n.index is not None and self.constants_ok:  # read by a KernelBench candidate
            return _Val(self.load(int(n.index), n.shape or (), n.dtype or "float32"), tuple(n.shape or ()))
        if o == "constant_tensor":  # refused where it is used (an unused buffer costs nothing)
            return Refusal(f"a constant tensor ({n.kwargs.get('target')}) that no input of the ABI carries")
        if o == "index.Tensor":  # x[idx] with one index tensor on the first dim: embedding's gather
            idx = n.args[1]
            if len(idx) != 1 or idx[0] is None:
                raise Unsupported("indexing with several index tensors")
            return self.lower_gather(n.model_copy(update={"args": [n.args[0], idx[0]]}), "index0")
        if o in ("embedding", "index_select", "gather"):
            return self.lower_gather(n, o)
        if o == "repeat":
            x = self.val(n.args[0])
            self.notes.append("a repeat read in place (coordinates wrap)")
            return _Val(self.viewed(lambda: self.views.repeat(x.expr, x.shape, shape)), shape)
        if o == "pad":
            x = self.val(n.args[0])
            value = float(self.arg(n, 2, "value", 0.0) or 0.0)
            self.notes.append("a constant pad read in place (the value outside, a shifted read inside)")
            return _Val(self.viewed(lambda: self.views.pad(x.expr, x.shape, list(n.args[1]), value, shape)), shape)
        if o == "slice":
            return self.lower_slice(n)
        if o == "cat":
            return self.lower_cat(n)
        if o == "split":
            return self.lower_split(n)
        if o in ("permute", "t", "transpose"):
            return self.lower_permute(n)
        raise Unsupported(f"op {n.op!r} is not in the catalog")

    def lower_batch_stats(self, n: CNode) -> _Val:
        """Batch norm with the input's own statistics over every dim but the channel's: instance norm (as ATen
        writes it, on a [1, N*C, *] view) when the batch dim is 1."""
        src = self.g.node(n.args[0]["ref"]) if isinstance(n.args[0], dict) else None
        if src is not None and src.op in ("view", "_unsafe_view") and isinstance(src.args[0], dict):
            inner = self.val(src.args[0])  # instance norm as ATen writes it: x [N, C, *] viewed as [1, N*C, *]
            if len(inner.shape) >= 3 and tuple(src.shape or ())[2:] == inner.shape[2:] and not reductions(inner.expr):
                eps = float(self.arg(n, 5, "eps", 1e-5))
                if self.arg(n, 1, "weight") is None and self.arg(n, 2, "bias") is None:
                    return self._normalize(inner, tuple(range(2, len(inner.shape))), eps, None, None,
                                           "instance norm")
        x = self.val(self.arg(n, 0, "input"))
        if len(x.shape) < 3 or x.shape[0] != 1:
            raise Unsupported("batch norm with batch statistics (training mode, or no running stats)")
        if self.arg(n, 1, "weight") is not None or self.arg(n, 2, "bias") is not None:
            raise Unsupported("batch statistics with an affine")
        eps = float(self.arg(n, 5, "eps", 1e-5))
        return self._normalize(x, tuple(range(2, len(x.shape))), eps, None, None, "instance norm")

    def lower_slice(self, n: CNode) -> _Val:
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
        return self.viewed(lambda: _Val(self.views.slice(x.expr, x.shape, dim, start, step, shape[dim]), shape))

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

    def lower_gather(self, n: CNode, o: str) -> _Val:
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
        return _Val(substitute(src.expr, mapping), shape)

    def to_space(self, v: _Val, shape: tuple[int, ...]) -> Expr:
        """v's expression re-viewed to a shape that only adds or drops size-1 dims."""
        if has_views(v.expr, self.inputs):
            return self.viewed(lambda: self.views.resize_ones(v.expr, v.shape, shape))
        return self.reshape_loads(v.expr, shape)

    def lower_cat(self, n: CNode) -> _Val:
        vals = [self.val(r) for r in n.args[0]]
        shape = tuple(n.shape or ())
        dim = (int(self.arg(n, 1, "dim", 0)) + len(shape)) % len(shape)
        self.notes.append("a concatenation read in place (each piece's loads shifted, selected by position)")
        return self.viewed(lambda: _Val(self.views.cat([(v.expr, v.shape) for v in vals], dim, shape), shape))

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
            out.append(_Val(e, shape))
            start += size
        self.notes.append("a split read in place (index arithmetic in the load)")
        return tuple(out)

    def lower_permute(self, n: CNode) -> _Val:
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
        return self.viewed(lambda: _Val(self.views.permute(x.expr, x.shape, perm), shape))

    def only_output(self, n: CNode) -> bool:
        """Is node n read by the graph's output alone (through views to it at most)?"""
        users = [m for m in self.g.nodes if n.name in str(m.args)]
        return bool(users) and all(m.op == "output" for m in users)

    def permute_program(self, x: _Val, perm: list[int], shape: tuple[int, ...]) -> _Val:
        """The output permuted (a channels-first LayerNorm permuted back): the whole program's space permutes, its
        reduced dims with it, and every load (inside the reductions too) reads through the permuted view."""
        assert self.F is not None and self.axes is not None
        axes = tuple(sorted(perm.index(a) for a in self.axes))
        if list(axes) != list(range(axes[0], axes[-1] + 1)):
            raise Unsupported("a permute that splits the reduced dims")
        e = self.viewed(lambda: self.views.permute(x.expr, x.shape, perm, into_reds=True))
        self.F, self.axes = shape, axes
        self.notes.append("the output permuted: the program's space permuted with it (reduced dims included)")
        return _Val(e, shape)

    def lower_getattr(self, n: CNode) -> Any:
        src, attr = self.env.get(_ref(n.args[0])), n.args[1]
        if isinstance(src, tuple) and attr in ("values", "indices"):
            return src[0 if attr == "values" else 1]
        if attr in ("T", "mT") and isinstance(src, _LazyLoad) and len(src._n.shape or ()) == 2:
            return _Transposed(src._n)
        raise Unsupported(f"attribute {attr!r} of a value")

    def lower_transpose(self, n: CNode) -> Any:
        src = self.env[_ref(n.args[0])]
        dims = [a for x in n.args[1:] for a in (x if isinstance(x, list) else [x]) if isinstance(a, int)]
        if len(src._n.shape or ()) == 2 and (n.op == "t" or sorted(dims) == [0, 1] or dims == [-1, -2]
                                              or dims == [-2, -1]):
            return _Transposed(src._n)
        return self.lower_permute(n)

    def viewed(self, fn) -> Any:
        try:
            return fn()
        except ViewError as e:
            raise Unsupported(str(e)) from None

    def lower_view(self, n: CNode) -> _Val:
        x = self.val(n.args[0])
        shape = tuple(n.shape or ())
        if n.op in ("expand", "expand_as"):
            return _Val(x.expr, shape)
        if prod(shape) != prod(x.shape):
            raise Unsupported(f"{n.op} changes the number of elements")
        if shape == x.shape:
            return x
        if reductions(x.expr) and self.F is not None and self.is_row_space(x.shape) and self.is_row_space(shape):
            return _Val(x.expr, shape)  # a per-row value: its loads already index the program's space
        if has_views(x.expr, self.inputs):
            return self.viewed(lambda: _Val(self.views.reshape(x.expr, x.shape, shape), shape))
        if isinstance(x.expr, Load):
            inp = self.inputs[x.expr.k]
            if prod(inp.shape) == prod(shape):
                return _Val(self.load(inp.abi, shape, inp.dtype, viewed=True), shape)
        if [s for s in shape if s != 1] == [s for s in x.shape if s != 1]:
            # a size-1 dim added or dropped: only loads need a new view, a reduction keeps its row
            try:
                return _Val(self.reshape_loads(x.expr, shape), shape)
            except Unsupported:
                if reductions(x.expr):
                    raise
        if not reductions(x.expr):  # dims merged or split: each load's index as terms
            return self.viewed(lambda: _Val(self.views.reshape(x.expr, x.shape, shape), shape))
        raise Unsupported(f"{n.op} of a computed tensor from {list(x.shape)} to {list(shape)}")

    def reshape_loads(self, e: Expr, shape: tuple[int, ...]) -> Expr:
        loads = [x for x in walk(e) if isinstance(x, Load)]
        if any(prod(self.inputs[x.k].shape) not in (1, prod(shape)) for x in loads if not in_red(e, x)):
            raise Unsupported("a view of an expression over inputs of different shapes")
        mapping = {x: self.load(self.inputs[x.k].abi, shape, self.inputs[x.k].dtype, viewed=True)
                   for x in loads if prod(self.inputs[x.k].shape) == prod(shape) and prod(shape) > 1}
        return substitute(e, mapping)

    def lower_reduction(self, n: CNode) -> Any:
        o = n.op
        x = self.val(self.arg(n, 0, "input"))
        nd = len(x.shape)
        dim = self.arg(n, 1, "dim")
        if o in ("max", "min") and isinstance(dim, dict):  # torch.max(a, b): elementwise
            return _Val(op("maximum" if o == "max" else "minimum", x.expr, self.val(dim).expr), tuple(n.shape or ()))
        if o == "norm":  # torch.norm / Tensor.norm: a vector norm over `dim` (all dims when None)
            p = self.arg(n, 1, "p", "fro")
            if p == "fro" or p is None:
                p = 2.0
            return self.pnorm(x, p, self.dims(self.arg(n, 2, "dim"), nd), bool(self.arg(n, 3, "keepdim", False)))
        if o == "linalg_vector_norm":
            if n.kwargs.get("dtype") not in (None, "float32"):
                raise Unsupported(f"vector_norm with dtype={n.kwargs['dtype']}")
            return self.pnorm(x, self.arg(n, 1, "ord", 2.0), self.dims(self.arg(n, 2, "dim"), nd),
                              bool(self.arg(n, 3, "keepdim", False)))
        if o == "linalg_norm":
            ord_, dim = self.arg(n, 1, "ord"), self.arg(n, 2, "dim")
            keep = bool(self.arg(n, 3, "keepdim", False))
            if n.kwargs.get("dtype") not in (None, "float32"):
                raise Unsupported(f"linalg.norm with dtype={n.kwargs['dtype']}")
            matrix = (isinstance(dim, list | tuple) and len(dim) == 2) or (dim is None and ord_ is not None and nd == 2)
            if matrix and ord_ not in (None, "fro"):
                raise Unsupported(f"matrix norm with ord={ord_}")  # spectral, nuclear, max row/column sums
            if dim is None and ord_ is not None and nd > 2:
                raise Unsupported("linalg.norm with ord and no dim over more than 2 dims")
            return self.pnorm(x, 2.0 if ord_ in (None, "fro") else ord_, self.dims(dim, nd), keep)
        if o == "normalize":  # F.normalize: x / max(||x||_p along dim, eps)
            p, dim, eps = self.arg(n, 1, "p", 2.0), self.arg(n, 2, "dim", 1), float(self.arg(n, 3, "eps", 1e-12))
            if self.arg(n, 4, "out") is not None:
                raise Unsupported("normalize with out=")
            nrm = self.pnorm(x, p, self.dims(dim, nd), True)
            return self.pointwise(n, "div", x, _Val(op("clamp_min", nrm.expr, attrs=(eps,)), nrm.shape))
        keep = bool(self.arg(n, 2, "keepdim", False))
        d = self.dims(dim, nd)
        kind = {"amax": "max", "amin": "min", "logsumexp": "lse", "std": "var"}.get(o, o)
        if o in ("var", "std"):
            corr = n.kwargs.get("correction", 1 if n.kwargs.get("unbiased", True) else 0)
            r = self.reduce("var", x, d, keep)
            e = r.expr
            if corr:
                e = op("mul", e, op("div", Dim("R"), op("sub", Dim("R"), Const(float(corr)))))
            return _Val(op("sqrt", e) if o == "std" else e, r.shape)
        if o in ("max", "min") and dim is not None:
            vals = self.reduce(kind, x, d, keep)
            idx = self.reduce("arg" + kind, x, d, keep)
            return (vals, idx)
        return self.reduce(kind, x, d, keep)

    def pnorm(self, x: _Val, p, d: tuple[int, ...], keep: bool) -> _Val:
        """The vector p-norm of x over dims d: L2 (and Frobenius), L1, max/min |x|, or (sum |x|^p)^(1/p)."""
        if isinstance(p, str) and p.lstrip("-") == "inf":
            p = float(p)
        if isinstance(p, bool) or not isinstance(p, int | float):
            raise Unsupported(f"norm with p={p!r}")
        p = float(p)
        if p == 2.0:
            self.notes.append("L2/Frobenius norm: sqrt of a sum of squares")
            r = self.reduce("sum", _Val(op("square", x.expr), x.shape), d, keep)
            return _Val(op("sqrt", r.expr), r.shape)
        if p == 1.0:
            self.notes.append("L1 norm: sum of absolute values")
            return self.reduce("sum", _Val(op("abs", x.expr), x.shape), d, keep)
        if math.isinf(p):
            return self.reduce("max" if p > 0 else "min", _Val(op("abs", x.expr), x.shape), d, keep)
        if p > 0:
            self.notes.append(f"p-norm with p={p:g}: a sum of |x|^p, then its 1/p-th power")
            r = self.reduce("sum", _Val(op("powc", op("abs", x.expr), attrs=(p,)), x.shape), d, keep)
            return _Val(op("powc", r.expr, attrs=(1.0 / p,)), r.shape)
        raise Unsupported(f"norm with p={p:g}")  # p = 0 counts non-zeros; p < 0 is not a norm

    def lower_layer_norm(self, n: CNode) -> _Val:
        x = self.val(self.arg(n, 0, "input"))
        ns = n.kwargs.get("normalized_shape") or self.arg(n, 1, "normalized_shape")
        ns = [ns] if isinstance(ns, int) else list(ns)
        eps = float(n.kwargs.get("eps", self.arg(n, 4, "eps", 1e-5)) or 1e-5)
        if "module" in n.kwargs:
            w = self.val(n.args[1]) if len(n.args) > 1 else None
            b = self.val(n.args[2]) if len(n.args) > 2 else None
        else:
            w = self.val(self.arg(n, 2, "weight")) if self.arg(n, 2, "weight") is not None else None
            b = self.val(self.arg(n, 3, "bias")) if self.arg(n, 3, "bias") is not None else None
        d = tuple(range(len(x.shape) - len(ns), len(x.shape)))
        return self._normalize(x, d, eps, w, b, "layer norm")

    def lower_instance_norm(self, n: CNode) -> _Val:
        """Mean and variance per sample and channel over the spatial dims; with running statistics (a module that
        tracks them, in eval mode, or the functional form with use_input_stats=False) an affine per channel."""
        x = self.val(self.arg(n, 0, "input"))
        if len(x.shape) < 3:
            raise Unsupported("instance norm of an unbatched input")
        if "module" in n.kwargs:
            eps = float(n.kwargs.get("eps", 1e-5))
            refs = list(n.args[1:])
            if n.kwargs.get("running"):
                mean, var, refs = refs[0], refs[1], refs[2:]
            w, b = (refs[0], refs[1]) if n.kwargs.get("affine") and len(refs) >= 2 else (None, None)
            if n.kwargs.get("running"):
                return self._running_affine(x, mean, var, w, b, eps, "instance norm with running statistics")
        else:
            w, b = self.arg(n, 3, "weight"), self.arg(n, 4, "bias")
            eps = float(self.arg(n, 7, "eps", 1e-5))
            if not self.arg(n, 5, "use_input_stats", True):
                mean, var = self.arg(n, 1, "running_mean"), self.arg(n, 2, "running_var")
                if mean is None or var is None:
                    raise Unsupported("instance norm without input statistics or running ones")
                return self._running_affine(x, mean, var, w, b, eps, "instance norm with running statistics")
        view = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        wv = _Val(self._channel(w, x), view) if w is not None else None
        bv = _Val(self._channel(b, x), view) if b is not None else None
        return self._normalize(x, tuple(range(2, len(x.shape))), eps, wv, bv, "instance norm")

    def _channel(self, ref, x: _Val) -> Expr:
        """A per-channel vector [C] read as [C, 1, ..., 1] against x [N, C, *]."""
        v = self.val(ref)
        if not isinstance(v.expr, Load):
            raise Unsupported("per-channel statistics that are computed")
        inp = self.inputs[v.expr.k]
        view = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        return self.load(inp.abi, view, inp.dtype, viewed=True)

    def lower_batch_norm(self, n: CNode) -> _Val:
        """Batch norm with running statistics (eval mode): an elementwise affine per channel."""
        x = self.val(self.arg(n, 0, "input"))
        if "module" in n.kwargs:
            if not n.kwargs.get("running"):
                raise Unsupported("batch norm with batch statistics (training mode, or no running stats)")
            refs = n.args[1:]
            eps = float(n.kwargs.get("eps", 1e-5))
            mean, var = refs[0], refs[1]
            w, b = (refs[2], refs[3]) if n.kwargs.get("affine") else (None, None)
        else:
            if self.arg(n, 5, "training", False):
                raise Unsupported("batch norm in training mode")
            mean, var = self.arg(n, 1, "running_mean"), self.arg(n, 2, "running_var")
            w, b = self.arg(n, 3, "weight"), self.arg(n, 4, "bias")
            eps = float(self.arg(n, 7, "eps", 1e-5))
        return self._running_affine(x, mean, var, w, b, eps, "batch norm with running statistics")

    def _running_affine(self, x: _Val, mean, var, w, b, eps: float, what: str) -> _Val:
        """(x - mean) * rsqrt(var + eps) * w + b with per-channel statistics and weights: elementwise."""
        if len(x.shape) < 2:
            raise Unsupported(f"{what} of a tensor without a channel dim")
        e = op("mul", op("sub", x.expr, self._channel(mean, x)),
               op("rsqrt", op("add", self._channel(var, x), Const(eps))))
        if w is not None:
            e = op("mul", e, self._channel(w, x))
        if b is not None:
            e = op("add", e, self._channel(b, x))
        self.notes.append(f"{what}: an elementwise affine per channel")
        return _Val(e, x.shape)

    def lower_group_norm(self, n: CNode) -> _Val:
        """x [N, C, *] in groups: F = [N, G, C/G, S] (the same memory), reduced over (C/G, S)."""
        x = self.val(self.arg(n, 0, "input"))
        module = "module" in n.kwargs
        groups = int(n.kwargs["num_groups"] if module else self.arg(n, 1, "num_groups"))
        eps = float(n.kwargs.get("eps", 1e-5) if module else self.arg(n, 4, "eps", 1e-5))
        if len(x.shape) < 2 or x.shape[1] % groups or self.F is not None or reductions(x.expr):
            raise Unsupported("group norm after another reduction")
        nb, c = x.shape[0], x.shape[1]
        s = prod(x.shape[2:])
        grouped = (nb, groups, c // groups, s)
        mapping: dict[Expr, Expr] = {}
        for ld in {e for e in walk(x.expr) if isinstance(e, Load)}:
            inp = self.inputs[ld.k]
            if prod(inp.shape) == prod(x.shape):  # a full-size tensor: the grouped view of the same memory
                mapping[ld] = self.load(inp.abi, grouped, inp.dtype, viewed=True)
            elif prod(inp.shape) != 1:
                raise Unsupported("group norm of an expression over broadcast tensors (a per-channel bias...)")
        xv = _Val(substitute(x.expr, mapping), grouped)
        w = b = None
        refs = n.args[1:3] if module else [self.arg(n, 2, "weight"), self.arg(n, 3, "bias")]
        if module and not n.kwargs.get("affine", True):
            refs = []
        wb = []
        for r in refs:
            if r is None:
                wb.append(None)
                continue
            v = self.val(r)
            if not isinstance(v.expr, Load):
                raise Unsupported("group norm with computed weights")
            wi = self.inputs[v.expr.k]
            view = (groups, c // groups, 1)
            wb.append(_Val(self.load(wi.abi, view, wi.dtype, viewed=True), view))
        w, b = (wb + [None, None])[:2]
        out = self._normalize(xv, (2, 3), eps, w, b, f"group norm ({groups} groups)")
        self.view_loads = {x for x in walk(out.expr) if isinstance(x, Load)}
        return _Val(out.expr, tuple(n.shape or x.shape))

    def _normalize(self, x: _Val, d, eps: float, w: _Val | None, b: _Val | None, what: str) -> _Val:
        mean = self.reduce("mean", x, d, True)
        var = self.reduce("var", x, d, True)
        self.notes.append(f"{what} over dims {list(d)}: mean and variance per row, then scale and shift")
        e = op("mul", op("sub", x.expr, mean.expr), op("rsqrt", op("add", var.expr, Const(eps))))
        if w is not None:
            e = op("mul", e, w.expr)
        if b is not None:
            e = op("add", e, b.expr)
        return _Val(e, x.shape)

    def lower_loss(self, n: CNode) -> _Val:
        x, t = self.val(self.arg(n, 0, "input")), self.val(self.arg(n, 1, "target"))
        red = n.kwargs.get("reduction", "mean")
        shape = tuple(int(s) for s in _broadcast(x.shape, t.shape))
        diff = op("sub", x.expr, t.expr)
        if n.op == "mse_loss":
            e = op("square", diff)
        elif n.op == "l1_loss":
            e = op("abs", diff)
        elif n.op in ("smooth_l1_loss", "huber_loss"):
            beta = float(n.kwargs.get("beta", n.kwargs.get("delta", 1.0)))
            ad = op("abs", diff)
            quad = op("mul", op("square", diff), Const(0.5 / beta if n.op == "smooth_l1_loss" else 0.5))
            lin = op("sub", ad, Const(0.5 * beta)) if n.op == "smooth_l1_loss" else \
                op("mul", Const(beta), op("sub", ad, Const(0.5 * beta)))
            e = Op("where_lt", (ad, Const(beta), quad, lin))
        else:  # kl_div(input=log q, target=p): p * (log p - input)
            if n.kwargs.get("log_target"):
                e = op("mul", op("exp", t.expr), op("sub", t.expr, x.expr))
            else:
                e = Op("xlogy_minus", (t.expr, x.expr))
        self.notes.append(f"{n.op} with reduction={red}")
        if red == "none":
            return _Val(e, shape)
        if red == "sum":
            return self.reduce("sum", _Val(e, shape), (), False)
        s = self.reduce("sum", _Val(e, shape), (), False)
        if red == "batchmean":
            return _Val(op("div", s.expr, Dim("F0")), ())
        return _Val(op("div", s.expr, Dim("R")), ())

    def lower_heavy(self, n: CNode) -> _Val:
        if n.op == "matmul":
            x, y = self.env[n.args[0]["ref"]], self.env[n.args[1]["ref"]]
            if isinstance(x, _Diag) and isinstance(y, _Val) and isinstance(y.expr, Load):
                self.notes.append("diag(a) @ B is a broadcast multiply a[:, None] * B")
                col = self.load(self.inputs[x.k].abi, (x.n, 1), self.inputs[x.k].dtype, True)
                return _Val(op("mul", col, y.expr), tuple(n.shape or ()))
            if isinstance(y, _Diag) and isinstance(x, _Val) and isinstance(x.expr, Load):
                self.notes.append("A @ diag(b) is a broadcast multiply A * b[None, :]")
                return _Val(op("mul", x.expr, Load(y.k)), tuple(n.shape or ()))
        if self.heavy is not None or self.inputs:
            raise Unsupported("more than one heavy op, or work before the heavy op")
        abis, call_args = [], []
        for a in n.args:
            if isinstance(a, dict) and isinstance(self.env.get(a["ref"]), _Transposed):
                tn = self.env[a["ref"]].node
                abis.append(int(tn.index))
                call_args.append({"abi": int(tn.index), "t": True})
            elif isinstance(a, dict) and "ref" in a:
                src = self.g.node(a["ref"])
                if src.op not in ("input", "param"):
                    raise Unsupported("the heavy op's operands are computed (a prologue before the GEMM/conv)")
                abis.append(int(src.index))
                call_args.append({"abi": int(src.index)})
            elif isinstance(a, dict | list) and "ref" in str(a):
                raise Unsupported("the heavy op takes a list of tensors")
            else:
                call_args.append(a)
        if n.kwargs.get("module"):  # a module call: its own weights were appended by the capture
            n_params = len(n.kwargs.get("params", []))
            call_args = call_args[: len(call_args) - n_params] if n_params else call_args
            kw = {"module": n.kwargs["module"]}
        else:
            kw = dict(n.kwargs)
        if any(isinstance(v, dict) for v in kw.values()):
            raise Unsupported("the heavy op takes a tensor by keyword")
        self.heavy = Heavy(op=n.op, module=n.kwargs.get("module"), args_abi=abis, kwargs=kw,
                           shape=list(n.shape or ()), dtype=n.dtype or "float32", call_args=call_args)
        self.notes.append(f"{n.op} stays on torch (cuBLAS/cuDNN); the epilogue after it becomes one kernel")
        self.inputs.append(Input(abi=-1, shape=tuple(n.shape or ()), dtype=n.dtype or "float32"))
        return _Val(Load(len(self.inputs) - 1), tuple(n.shape or ()))

    def run(self) -> Pattern:
        if self.g.unsupported:
            return Pattern("unsupported", reason=self.g.unsupported)
        out_node = None
        for raw in self.g.nodes:
            n = translate(raw)
            if n.op == "output":
                out_node = n
                continue
            # inputs resolve lazily: a diag's input must not count as work before the heavy op
            if n.op in ("input", "param") and n.kwargs.get("structure") is None:
                self.env[n.name] = _LazyLoad(self, n)
                continue
            try:
                self.env[n.name] = self.rounded(n, self.lower_node(n))
            except Unsupported as e:
                where = f" (at {raw.where})" if raw.where and "(at " not in str(e) else ""
                raise Unsupported(f"{e}{where}") from None
        assert out_node is not None
        res = out_node.args[0]
        res = res if isinstance(res, list) else [res]
        vals = [self.val(r) for r in res]
        nodes = [self.g.node(r["ref"]) if isinstance(r, dict) else None for r in res]
        return self.finish(vals[0], nodes[0], list(zip(vals[1:], nodes[1:], strict=True)))

    def rounded(self, n: CNode, v: Any) -> Any:
        """A value the reference computes in bf16/fp16 is rounded to that type where the op writes it."""
        if n.dtype in HALF and isinstance(v, _Val) and isinstance(v.expr, Op | Red) and n.op not in IDENTITY \
                and not (isinstance(v.expr, Op) and v.expr.name in HALF.values()):
            return _Val(op(HALF[n.dtype], v.expr), v.shape)
        return v

    def finish(self, v: _Val, outn: CNode | None, more: list | None = None) -> Pattern:
        out_shape = tuple(outn.shape or ()) if outn else ()
        out_dtype = (outn.dtype if outn else None) or "float32"
        if self.F is None:
            F, axes = out_shape, ()
        else:
            F, axes = self.F, self.axes or ()
        expr = fold_lse(v.expr)
        more = [(_Val(fold_lse(w.expr), w.shape), m) for w, m in (more or [])]
        if any(r.kind == "lse" for r in reductions(expr)) and not any("lse" in x for x in self.notes):
            self.notes.append("lse: one log-sum-exp per row (folded from its max, exp, sum and log)")
        if not any(reductions(e) for e in [expr] + [w.expr for w, _ in (more or [])]):
            axes = ()  # every reduction folded away (dims of size 1): an elementwise program over F
            if prod(F or (1,)) != prod(out_shape or (1,)):
                F = out_shape  # ... or over the output, when what is left is per row (a constant, say)
        extra = [Output(w.expr, (m.dtype if m else None) or "float32", tuple(m.shape or ()) if m else ())
                 for w, m in (more or [])]
        for x in extra:
            if x.shape != out_shape and prod(x.shape) != prod(out_shape):
                raise Unsupported(f"outputs of different sizes: {list(out_shape)} and {list(x.shape)}")
        exprs, inputs = prune_all([expr] + [x.expr for x in extra], self.inputs)
        expr = exprs[0]
        for x, e in zip(extra, exprs[1:], strict=True):
            x.expr = e
        if extra:
            self.notes.append(f"{1 + len(extra)} outputs from one program")
        notes = self.notes + describe(expr)
        prog = Program(inputs=inputs, out=expr, shape=tuple(F), axes=tuple(axes), out_dtype=out_dtype,
                       out_shape=out_shape, notes=list(dict.fromkeys(notes)), more=extra)
        check_program(prog, self)
        skip = skipping.find(prog)
        if skip is not None:
            prog.limit, prog.beyond = skip
            prog.notes.append(f"a causal mask: each row reads only its first elements up to its own index; past them "
                              f"the output is {skip[1]:g} without a read")
        if self.heavy is not None and all(i.abi != -1 for i in inputs):
            prog.notes.append(f"the {self.heavy.op}'s result does not reach the output: no {self.heavy.op} needed")
            return Pattern("row" if prog.is_row and reductions(expr) else "elementwise", program=prog,
                           notes=prog.notes)
        if self.heavy is not None:
            if isinstance(expr, Load) and inputs[expr.k].abi == -1:
                return Pattern("unsupported", reason="the heavy op has no epilogue to fuse", notes=prog.notes)
            return Pattern("epilogue", program=prog, heavy=self.heavy, notes=prog.notes)
        return Pattern("row" if prog.is_row and reductions(expr) else "elementwise", program=prog, notes=prog.notes)


@dataclass
class Refusal:
    """A value the catalog cannot read: refused with its reason where an op uses it."""

    why: str


@dataclass
class _Transposed:
    """A 2-D input or weight read transposed: only a GEMM may take it (as torch would)."""

    node: CNode


def _ref(a) -> str:
    return a["ref"] if isinstance(a, dict) and "ref" in a else ""


class _LazyLoad(_Val):
    def __init__(self, low: _Lower, n: CNode):  # noqa: D107
        self._low, self._n, self._v = low, n, None

    def _get(self) -> _Val:
        if self._v is None:
            n = self._n
            self._v = _Val(self._low.load(int(n.index), n.shape or (), n.dtype or "float32"), tuple(n.shape or ()))
        return self._v

    @property
    def expr(self):  # type: ignore[override]
        return self._get().expr

    @property
    def shape(self):  # type: ignore[override]
        return self._get().shape


def _guarded_max(m: Expr) -> Expr | None:
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
            r = _guarded_max(m1)
            if r is not None and r.arg == x and _guarded_max(m) == r:
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
    return [_subst_all(e, mapping) for e in es], [inputs[k] for k in used]


def _subst_all(e: Expr, mapping: dict) -> Expr:
    if e in mapping:
        return mapping[e]
    return rebuild(e, lambda c: _subst_all(c, mapping))


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


def _is_float(dtype: str | None) -> bool:
    return dtype in ("float32", "float64", "bfloat16", "float16")


def _broadcast(a, b) -> tuple[int, ...]:
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


def check_program(p: Program, low: _Lower | None = None) -> None:
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


def recognise(g: CGraph) -> Pattern:
    """The pattern family of a captured graph, or `unsupported` with the reason."""
    try:
        if not g.unsupported and schedule.needs_schedule(g):
            return recognise_stages(g)
        return _Lower(g).run()
    except Unsupported as e:
        return Pattern("unsupported", reason=str(e))
    except (KeyError, TypeError, ValueError, IndexError) as e:
        return Pattern("unsupported", reason=f"could not lower the graph: {type(e).__name__}: {e}")


def recognise_stages(g: CGraph) -> Pattern:
    """Several heavy ops (or work before one): heavy ops on torch, the programs between them fused (family graph)."""
    plan = schedule.plan(g)
    notes = []
    best: Program | None = None
    for j, st in enumerate(plan.stages):
        if st.kind == "heavy":
            notes.append(f"stage {j}: {st.node.op} on torch")
            continue
        low = _Lower(st.graph)
        low.constants_ok = True
        pat = low.run()
        if pat.family not in ("elementwise", "row"):
            why = pat.reason or f"a {pat.family} pattern"
            return Pattern("unsupported", reason=f"stage {j} (computing {', '.join(st.outputs)}): {why}")
        st.pattern = pat
        notes.append(f"stage {j}: one fused program ({'; '.join(pat.notes[:2]) or pat.family})")
        if best is None or prod(pat.program.shape or (1,)) > prod(best.shape or (1,)):
            best = pat.program
    if best is None:
        return Pattern("unsupported", reason="heavy ops only: nothing between them to fuse")
    return Pattern("graph", program=best, notes=notes, plan=plan)
