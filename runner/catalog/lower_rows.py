"""Lowering of reductions and the row programs built from them: norms (layer, instance, batch, group, RMS, p-norms)
and losses.
"""

from __future__ import annotations

import math
from math import prod
from typing import Any

from runner.catalog.capture import CNode
from runner.catalog.ir import (
    Const,
    Dim,
    Expr,
    Load,
    Op,
    op,
    reductions,
    walk,
)
from runner.catalog.lowering import Lowering, Val
from runner.catalog.pattern import (
    Unsupported,
    broadcast_shape,
    substitute,
)


class RowOps(Lowering):
    def lower_batch_stats(self, n: CNode) -> Val:
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

    def lower_reduction(self, n: CNode) -> Any:
        o = n.op
        x = self.val(self.arg(n, 0, "input"))
        nd = len(x.shape)
        dim = self.arg(n, 1, "dim")
        if o in ("max", "min") and isinstance(dim, dict):  # torch.max(a, b): elementwise
            return Val(op("maximum" if o == "max" else "minimum", x.expr, self.val(dim).expr), tuple(n.shape or ()))
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
            return self.pointwise(n, "div", x, Val(op("clamp_min", nrm.expr, attrs=(eps,)), nrm.shape))
        keep = bool(self.arg(n, 2, "keepdim", False))
        d = self.dims(dim, nd)
        kind = {"amax": "max", "amin": "min", "logsumexp": "lse", "std": "var"}.get(o, o)
        if o in ("var", "std"):
            corr = n.kwargs.get("correction", 1 if n.kwargs.get("unbiased", True) else 0)
            r = self.reduce("var", x, d, keep)
            e = r.expr
            if corr:
                e = op("mul", e, op("div", Dim("R"), op("sub", Dim("R"), Const(float(corr)))))
            return Val(op("sqrt", e) if o == "std" else e, r.shape)
        if o in ("max", "min") and dim is not None:
            vals = self.reduce(kind, x, d, keep)
            idx = self.reduce("arg" + kind, x, d, keep)
            return (vals, idx)
        return self.reduce(kind, x, d, keep)

    def pnorm(self, x: Val, p, d: tuple[int, ...], keep: bool) -> Val:
        """The vector p-norm of x over dims d: L2 (and Frobenius), L1, max/min |x|, or (sum |x|^p)^(1/p)."""
        if isinstance(p, str) and p.lstrip("-") == "inf":
            p = float(p)
        if isinstance(p, bool) or not isinstance(p, int | float):
            raise Unsupported(f"norm with p={p!r}")
        p = float(p)
        if p == 2.0:
            self.notes.append("L2/Frobenius norm: sqrt of a sum of squares")
            r = self.reduce("sum", Val(op("square", x.expr), x.shape), d, keep)
            return Val(op("sqrt", r.expr), r.shape)
        if p == 1.0:
            self.notes.append("L1 norm: sum of absolute values")
            return self.reduce("sum", Val(op("abs", x.expr), x.shape), d, keep)
        if math.isinf(p):
            return self.reduce("max" if p > 0 else "min", Val(op("abs", x.expr), x.shape), d, keep)
        if p > 0:
            self.notes.append(f"p-norm with p={p:g}: a sum of |x|^p, then its 1/p-th power")
            r = self.reduce("sum", Val(op("powc", op("abs", x.expr), attrs=(p,)), x.shape), d, keep)
            return Val(op("powc", r.expr, attrs=(1.0 / p,)), r.shape)
        raise Unsupported(f"norm with p={p:g}")  # p = 0 counts non-zeros; p < 0 is not a norm

    def lower_layer_norm(self, n: CNode) -> Val:
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

    def lower_instance_norm(self, n: CNode) -> Val:
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
        wv = Val(self._channel(w, x), view) if w is not None else None
        bv = Val(self._channel(b, x), view) if b is not None else None
        return self._normalize(x, tuple(range(2, len(x.shape))), eps, wv, bv, "instance norm")

    def _channel(self, ref, x: Val) -> Expr:
        """A per-channel vector [C] read as [C, 1, ..., 1] against x [N, C, *]."""
        v = self.val(ref)
        if not isinstance(v.expr, Load):
            raise Unsupported("per-channel statistics that are computed")
        inp = self.inputs[v.expr.k]
        view = (x.shape[1],) + (1,) * (len(x.shape) - 2)
        return self.load(inp.abi, view, inp.dtype, viewed=True)

    def lower_batch_norm(self, n: CNode) -> Val:
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

    def _running_affine(self, x: Val, mean, var, w, b, eps: float, what: str) -> Val:
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
        return Val(e, x.shape)

    def lower_group_norm(self, n: CNode) -> Val:
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
        xv = Val(substitute(x.expr, mapping), grouped)
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
            wb.append(Val(self.load(wi.abi, view, wi.dtype, viewed=True), view))
        w, b = (wb + [None, None])[:2]
        out = self._normalize(xv, (2, 3), eps, w, b, f"group norm ({groups} groups)")
        self.view_loads = {x for x in walk(out.expr) if isinstance(x, Load)}
        return Val(out.expr, tuple(n.shape or x.shape))

    def _normalize(self, x: Val, d, eps: float, w: Val | None, b: Val | None, what: str) -> Val:
        mean = self.reduce("mean", x, d, True)
        var = self.reduce("var", x, d, True)
        self.notes.append(f"{what} over dims {list(d)}: mean and variance per row, then scale and shift")
        e = op("mul", op("sub", x.expr, mean.expr), op("rsqrt", op("add", var.expr, Const(eps))))
        if w is not None:
            e = op("mul", e, w.expr)
        if b is not None:
            e = op("add", e, b.expr)
        return Val(e, x.shape)

    def lower_loss(self, n: CNode) -> Val:
        x, t = self.val(self.arg(n, 0, "input")), self.val(self.arg(n, 1, "target"))
        red = n.kwargs.get("reduction", "mean")
        shape = tuple(int(s) for s in broadcast_shape(x.shape, t.shape))
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
            return Val(e, shape)
        if red == "sum":
            return self.reduce("sum", Val(e, shape), (), False)
        s = self.reduce("sum", Val(e, shape), (), False)
        if red == "batchmean":
            return Val(op("div", s.expr, Dim("F0")), ())
        return Val(op("div", s.expr, Dim("R")), ())
