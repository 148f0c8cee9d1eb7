"""Row programs built directly in the IR for the CUDA codegen tests: LayerNorm, RMSNorm, softmax, a row sum and an
argmax over rows of R elements (innermost), in any float dtype."""

from __future__ import annotations

from runner.catalog.ir import Const, Input, Load, Op, Program, Red

X, W, B = Load(0), Load(1), Load(2)


def _op(name: str, *args) -> Op:
    return Op(name, tuple(args))


def layernorm(rows: int, n: int, dtype: str = "float32", eps: float = 1e-5) -> Program:
    """(x - mean) / sqrt(var + eps) * w + b over the last dim; w and b of shape [n]."""
    norm = _op("div", _op("sub", X, Red("mean", X)), _op("sqrt", _op("add", Red("var", X), Const(eps))))
    return Program(inputs=[Input(0, (rows, n), dtype), Input(1, (n,), dtype), Input(2, (n,), dtype)],
                   out=_op("add", _op("mul", norm, W), B), shape=(rows, n), axes=(1,), out_dtype=dtype,
                   out_shape=(rows, n))


def rmsnorm(rows: int, n: int, dtype: str = "float32", eps: float = 1e-6) -> Program:
    """x * rsqrt(mean(x^2) + eps) * w over the last dim."""
    scale = _op("rsqrt", _op("add", Red("mean", _op("square", X)), Const(eps)))
    return Program(inputs=[Input(0, (rows, n), dtype), Input(1, (n,), dtype)], out=_op("mul", _op("mul", X, scale), W),
                   shape=(rows, n), axes=(1,), out_dtype=dtype, out_shape=(rows, n))


def softmax(rows: int, n: int, dtype: str = "float32") -> Program:
    e = _op("exp", _op("sub", X, Red("max", X)))
    return Program(inputs=[Input(0, (rows, n), dtype)], out=_op("div", e, Red("sum", e)), shape=(rows, n), axes=(1,),
                   out_dtype=dtype, out_shape=(rows, n))


def row_sum(rows: int, n: int, dtype: str = "float32") -> Program:
    return Program(inputs=[Input(0, (rows, n), dtype)], out=Red("sum", X), shape=(rows, n), axes=(1,), out_dtype=dtype,
                   out_shape=(rows,))


def row_argmax(rows: int, n: int, dtype: str = "float32") -> Program:
    return Program(inputs=[Input(0, (rows, n), dtype)], out=Red("argmax", X), shape=(rows, n), axes=(1,),
                   out_dtype="int64", out_shape=(rows,))
