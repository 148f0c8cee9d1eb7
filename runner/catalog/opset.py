"""The catalog's op set: core ATen, as torch.export decomposes every spelling of a module (runner.catalog.capture).

`translate(node)` maps one core-ATen node onto the lowering's vocabulary (runner.catalog.recognition): the name of
the operation and its arguments in the positions the lowering reads. Every spelling of one op (F.softmax,
Tensor.softmax, nn.Softmax; masked_fill and torch.where; .to, .float() and .type_as) arrives here as the same ATen
op, so this table is the whole op set. A node whose op is not here is not understood, and recognition says which op
and at which source line.
"""

from __future__ import annotations

from runner.catalog import ops
from runner.catalog.capture import CNode

# ATen name (with its overload, '.default' dropped) -> the lowering's name, arguments in the same positions: the scalar
# ops' (runner.catalog.ops) and the structural ones below
STRUCTURAL = {
    "rsub.Scalar": "rsub", "rsub.Tensor": "rsub", "hardtanh": "hardtanh", "clamp": "clamp",
    "amax": "amax", "amin": "amin", "argmax": "argmax", "argmin": "argmin", "max.dim": "max", "min.dim": "min",
    "prod.dim_int": "prod", "logsumexp": "logsumexp", "linalg_vector_norm": "linalg_vector_norm",
    "_softmax": "softmax", "_log_softmax": "log_softmax", "view": "view", "_unsafe_view": "view",
    "reshape": "view", "unsqueeze": "unsqueeze", "squeeze": "squeeze", "squeeze.dim": "squeeze",
    "squeeze.dims": "squeeze", "expand": "expand", "alias": "identity", "clone": "identity", "detach": "identity",
    "lift_fresh_copy": "identity", "contiguous": "identity", "dropout": "identity", "permute": "permute",
    "t": "t", "transpose.int": "transpose", "diag": "diag", "linear": "linear",
    "matmul": "matmul", "mm": "matmul", "bmm": "matmul", "addmm": "addmm", "conv1d": "conv1d", "conv2d": "conv2d",
    "conv3d": "conv3d", "conv_transpose1d.input": "conv_transpose1d", "conv_transpose2d.input": "conv_transpose2d",
    "conv_transpose3d.input": "conv_transpose3d", "einsum": "einsum", "slice.Tensor": "slice", "cat": "cat",
    "gather": "gather", "index_select": "index_select", "embedding": "embedding", "select.int": "select",
    "scalar_tensor": "const", "full": "full",
    "full_like": "full_like", "ones_like": "ones_like", "zeros_like": "zeros_like", "arange.start_step": "arange",
    "arange": "arange", "split_with_sizes": "split", "split.Tensor": "split",
    "constant_pad_nd": "pad", "repeat": "repeat", "arange.start": "arange", "iota": "arange",
    "_to_copy": "to_dtype", "convert_element_type": "to_dtype", "mean.dim": "mean", "mean": "mean",
    "sum.dim_IntList": "sum", "sum": "sum", "var.correction": "var", "var_mean.correction": "var_mean",
    "std.correction": "std", "max": "amax", "min": "amin", "prod": "prod",
}
SAME_ARGS = ops.ATEN | STRUCTURAL


def translate(n: CNode) -> CNode:
    """The node in the lowering's vocabulary (unchanged when it is already: input, param, const, getitem...)."""
    o = n.op
    if o in ("input", "param", "const", "output", "getitem", "constant_tensor"):
        return n
    if o == "native_layer_norm":  # (x, normalized_shape, w, b, eps) -> (out, mean, rstd)
        return n.model_copy(update={"op": "layer_norm_t"})
    if o == "native_group_norm":  # (x, w, b, N, C, HxW, groups, eps) -> (out, mean, rstd)
        x, w, b, _, _, _, groups, eps = n.args
        return n.model_copy(update={"op": "group_norm_t", "args": [x, groups, w, b, eps]})
    if o == "_native_batch_norm_legit_no_training":  # (x, w, b, running_mean, running_var, momentum, eps)
        x, w, b, rm, rv, mom, eps = n.args
        return n.model_copy(update={"op": "batch_norm_t", "args": [x, rm, rv, w, b, False, mom, eps]})
    if o == "instance_norm":  # (x, w, b, running_mean, running_var, use_input_stats, momentum, eps, cudnn)
        x, w, b, rm, rv, use_stats, mom, eps = (n.args + [None] * 9)[:8]
        return n.model_copy(update={"op": "instance_norm", "args": [x, rm, rv, w, b, use_stats, mom, eps]})
    if o in ("_native_batch_norm_legit_functional", "_native_batch_norm_legit", "native_batch_norm"):
        return n.model_copy(update={"op": "refuse", "kwargs": {"why": "batch norm in training mode (batch statistics)"}})
    if o.startswith(("_linalg_svd", "linalg_svd", "_linalg_eigh", "linalg_matrix_norm")):
        return n.model_copy(update={"op": "refuse", "kwargs": {"why": "a matrix norm (singular values)"}})
    if o == "_native_batch_norm_legit.no_stats":  # (x, w, b, training, momentum, eps): the input's own statistics
        return n.model_copy(update={"op": "batch_stats_norm_t"})
    if o in ("sum.dim_IntList", "mean.dim", "amax", "amin") and len(n.args) > 1 and n.args[1] == []:
        return n.model_copy(update={"op": SAME_ARGS[o], "args": [n.args[0], None, *n.args[2:]]})
    if o in ("var.correction", "std.correction", "var_mean.correction"):
        kw = dict(n.kwargs)
        kw["correction"] = 1 if kw.get("correction") is None else kw["correction"]
        dim = n.args[1] if len(n.args) > 1 else None
        return n.model_copy(update={"op": SAME_ARGS[o], "args": [n.args[0], dim or None,
                                                                  kw.pop("keepdim", False)], "kwargs": kw})
    if o in SAME_ARGS:
        return n.model_copy(update={"op": SAME_ARGS[o]})
    return n
