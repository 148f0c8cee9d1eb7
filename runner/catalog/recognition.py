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
from dataclasses import replace
from math import prod
from typing import Any

from runner.catalog import ops, rope, schedule, skipping
from runner.catalog.capture import ARANGE, TRIL, CGraph, CNode
from runner.catalog.ir import (
    Const,
    Input,
    Iota,
    Load,
    Op,
    Output,
    Program,
    Red,
    op,
    reductions,
)
from runner.catalog.lower_rows import RowOps
from runner.catalog.lower_views import ViewOps
from runner.catalog.lowering import Diag, LazyLoad, Transposed, Val, ref_name
from runner.catalog.ops import ROUND_TO, ROUNDINGS
from runner.catalog.opset import translate
from runner.catalog.pattern import (
    HEAVY,
    IDENTITY,
    Heavy,
    Pattern,
    Refusal,
    Unsupported,
    check_program,
    describe,
    fold_lse,
    is_float,
    prune_all,
)


class _Lower(RowOps, ViewOps):
    """The graph walk: each node's op mapped onto the program (views and reductions in their own modules), the
    heavy op kept on torch, and the finished program."""

    def lower_node(self, n: CNode) -> Any:  # noqa: C901 - one table of ops
        o = n.op
        a = lambda i, name, d=None: self.arg(n, i, name, d)  # noqa: E731
        if o in ("input", "param", "constant_tensor") and n.kwargs.get("structure") == ARANGE:
            self.notes.append(f"{n.kwargs.get('target')} is 0, 1, 2, ... along its last dim: read as the index")
            return Val(Iota(0), tuple(n.shape or ()))
        if o in ("input", "param", "constant_tensor") and n.kwargs.get("structure") == TRIL:
            self.notes.append(f"{n.kwargs.get('target')} is a causal (lower-triangular) mask: read as col <= row")
            return Val(op("le", Iota(0), Iota(1)), tuple(n.shape or ()))
        if o in ("input", "param"):
            return Val(self.load(int(n.index), n.shape or (), n.dtype or "float32"), tuple(n.shape or ()))
        if o == "const" or (o == "tensor" and isinstance(a(0, "data"), int | float)):
            return Val(Const(float(n.args[0])), tuple(n.shape or ()))
        if o == "getattr":
            return self.lower_getattr(n)
        if o in ("t", "transpose", "permute") and isinstance(self.env.get(ref_name(n.args[0])), LazyLoad):
            return self.lower_transpose(n)
        if o in IDENTITY or (o == "to" and n.dtype == self.val(a(0, "input")).expr and False):
            return self.env[n.args[0]["ref"]] if isinstance(n.args[0], dict) else self.val(n.args[0])
        if o in HEAVY:
            return self.lower_heavy(n)
        if o == "diag":
            x = self.val(a(0, "input"))
            if len(x.shape) == 1 and isinstance(x.expr, Load) and not a(1, "diagonal", 0):
                return Diag(x.expr.k, x.shape[0])
            raise Unsupported("diag of a matrix or of a computed vector")
        if o in ("add", "sub", "mul", "div", "maximum", "minimum", "max_binary"):
            x, y = self.val(a(0, "input")), self.val(a(1, "other"))
            if o == "div" and n.kwargs.get("rounding_mode"):
                raise Unsupported("integer division")
            alpha = n.kwargs.get("alpha")
            if alpha is not None and o in ("add", "sub"):
                y = Val(op("mul", y.expr, Const(float(alpha))), y.shape)
            return self.pointwise(n, o, x, y)
        if o in ("rsub",):
            x, y = self.val(a(0, "input")), self.val(a(1, "other"))
            return self.pointwise(n, "sub", y, x)
        if o == "pow":
            x, e = a(0, "input"), a(1, "exponent")
            if isinstance(e, int | float):
                return self.pointwise(n, "powc", self.val(x), attrs=(float(e),))
            if isinstance(x, int | float) and x > 0:
                return Val(op("exp", op("mul", Const(math.log(x)), self.val(e).expr)), tuple(n.shape or ()))
            return self.pointwise(n, "pow", self.val(x), self.val(e))
        if o in ops.PLAIN:
            return self.pointwise(n, o, self.val(a(0, "input")))
        if o == "gelu":
            approx = n.kwargs.get("approximate", "none")
            return self.pointwise(n, "gelu_tanh" if approx == "tanh" else "gelu", self.val(a(0, "input")))
        if o == "leaky_relu":
            return self.pointwise(n, "leaky_relu", self.val(a(0, "input")),
                                  attrs=(float(a(1, "negative_slope", 0.01)),))
        if o in ("hardtanh", "relu6"):
            lo, hi = (0.0, 6.0) if o == "relu6" else (float(a(1, "min_val", -1.0)), float(a(2, "max_val", 1.0)))
            return Val(op("clamp_max", op("clamp_min", self.val(a(0, "input")).expr, attrs=(lo,)), attrs=(hi,)),
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
            return Val(e, tuple(n.shape or ()))
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
            return Val(e if o == "log_softmax" else op("exp", e), x.shape)
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
            if dst == src or dst in ("float32", "float64") or src in ("bool",) or not is_float(src):
                return x
            if dst in ROUND_TO:
                self.notes.append(f"rounded to {dst} where the reference converts")
                return Val(op(ROUND_TO[dst], x.expr), x.shape)
            if dst == "bool":
                return Val(op("ne", x.expr, Const(0.0)), x.shape)
            return Val(op("trunc", x.expr), x.shape)
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
            return Val(Const(float(a(0, "s"))), shape)
        if o == "full":
            return Val(Const(float(a(1, "fill_value"))), shape)
        if o in ("full_like", "zeros_like", "ones_like"):
            v = {"zeros_like": 0.0, "ones_like": 1.0}.get(o)
            return Val(Const(float(a(1, "fill_value")) if v is None else v), shape)
        if o == "arange":
            nums = [x for x in n.args if isinstance(x, int | float)]
            start, step = (0, 1) if len(nums) < 2 else (nums[0], nums[2] if len(nums) > 2 else 1)
            return Val(op("add", op("mul", Iota(0), Const(float(step))), Const(float(start))), shape)
        if o == "var_mean":
            x = self.val(a(0, "input"))
            var = self.lower_reduction(n.model_copy(update={"op": "var"}))
            mean = self.reduce("mean", x, self.dims(a(1, "dim"), len(x.shape)), bool(a(2, "keepdim", False)))
            return (var, mean)
        if o == "constant_tensor" and n.index is not None and self.constants_ok:  # read by a KernelBench candidate
            return Val(self.load(int(n.index), n.shape or (), n.dtype or "float32"), tuple(n.shape or ()))
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
            return Val(self.viewed(lambda: self.views.repeat(x.expr, x.shape, shape)), shape)
        if o == "pad":
            x = self.val(n.args[0])
            value = float(self.arg(n, 2, "value", 0.0) or 0.0)
            self.notes.append("a constant pad read in place (the value outside, a shifted read inside)")
            return Val(self.viewed(lambda: self.views.pad(x.expr, x.shape, list(n.args[1]), value, shape)), shape)
        if o in ("slice", "select"):
            return self.lower_slice(n) if o == "slice" else self.lower_select(n)
        if o == "cat":
            return self.lower_cat(n)
        if o == "split":
            return self.lower_split(n)
        if o in ("permute", "t", "transpose"):
            return self.lower_permute(n)
        raise Unsupported(f"op {n.op!r} is not in the catalog")

    def lower_heavy(self, n: CNode) -> Val:
        if n.op == "matmul":
            x, y = self.env[n.args[0]["ref"]], self.env[n.args[1]["ref"]]
            if isinstance(x, Diag) and isinstance(y, Val) and isinstance(y.expr, Load):
                self.notes.append("diag(a) @ B is a broadcast multiply a[:, None] * B")
                col = self.load(self.inputs[x.k].abi, (x.n, 1), self.inputs[x.k].dtype, True)
                return Val(op("mul", col, y.expr), tuple(n.shape or ()))
            if isinstance(y, Diag) and isinstance(x, Val) and isinstance(x.expr, Load):
                self.notes.append("A @ diag(b) is a broadcast multiply A * b[None, :]")
                return Val(op("mul", x.expr, Load(y.k)), tuple(n.shape or ()))
        if self.heavy is not None or self.inputs:
            raise Unsupported("more than one heavy op, or work before the heavy op")
        abis, call_args = [], []
        for a in n.args:
            if isinstance(a, dict) and isinstance(self.env.get(a["ref"]), Transposed):
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
        return Val(Load(len(self.inputs) - 1), tuple(n.shape or ()))

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
                self.env[n.name] = LazyLoad(self, n)
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
        if n.dtype in ROUND_TO and isinstance(v, Val) and isinstance(v.expr, Op | Red) and n.op not in IDENTITY \
                and not (isinstance(v.expr, Op) and v.expr.name in ROUNDINGS):
            return Val(op(ROUND_TO[n.dtype], v.expr), v.shape)
        return v

    def finish(self, v: Val, outn: CNode | None, more: list | None = None) -> Pattern:
        out_shape = tuple(outn.shape or ()) if outn else ()
        out_dtype = (outn.dtype if outn else None) or "float32"
        if self.F is None:
            F, axes = out_shape, ()
        else:
            F, axes = self.F, self.axes or ()
        expr = fold_lse(v.expr)
        more = [(Val(fold_lse(w.expr), w.shape), m) for w, m in (more or [])]
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
        shapes = {int(n.index): tuple(n.shape or ()) for n in self.g.nodes if n.op in ("input", "param")}
        if self.heavy is not None:
            shapes[-1] = tuple(self.heavy.shape)
        inputs = [replace(i, tensor=shapes.get(i.abi)) if i.viewed else i for i in inputs]  # (runner.catalog.sizes)
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
            prog.limit, prog.beyond, prog.kept = skip
            prog.notes.append(f"a causal mask: each row reads only its first elements up to its own index; past them "
                              f"the output is {skip[1]:g} without a read")
        prog.skip_zero = skipping.find_guard(prog)
        if not prog.is_row and self.heavy is None:
            prog.rope = rope.find(self.g)
            if prog.rope is not None:
                prog.notes.append(f"a rotary embedding ({prog.rope.style}: {prog.rope.rot} of {prog.rope.head} "
                                  f"features rotated, {len(prog.rope.xs)} output(s)): a vector of x and its partner "
                                  "per thread, cos and sin read once for every output")
        if prog.skip_zero is not None:
            prog.notes.append("a padding mask: where it is 0 the other inputs are not read")
        if self.heavy is not None and all(i.abi != -1 for i in inputs):
            prog.notes.append(f"the {self.heavy.op}'s result does not reach the output: no {self.heavy.op} needed")
            return Pattern("row" if prog.is_row and reductions(expr) else "elementwise", program=prog,
                           notes=prog.notes)
        if self.heavy is not None:
            if isinstance(expr, Load) and inputs[expr.k].abi == -1:
                return Pattern("unsupported", reason="the heavy op has no epilogue to fuse", notes=prog.notes)
            return Pattern("epilogue", program=prog, heavy=self.heavy, notes=prog.notes)
        return Pattern("row" if prog.is_row and reductions(expr) else "elementwise", program=prog, notes=prog.notes)


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
    whole = rope.find(g)
    if whole is not None and all(st.kind == "fused" for st in plan.stages) and not whole.one_shape:
        # a rotary embedding over outputs of different shapes (Llama's query and key-value heads): one program each
        # for the general templates, and the rope template's one launch for all of them
        best = replace(best, rope=whole)
        notes.append(f"a rotary embedding ({whole.style}) of {len(whole.xs)} outputs of different shapes: one rope "
                     "kernel writes them all")
    return Pattern("graph", program=best, notes=notes, plan=plan)
