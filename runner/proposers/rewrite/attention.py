"""Attention written out, to F.scaled_dot_product_attention: the statements that build the probabilities under one
name (scores `q @ k.transpose(-2, -1)` scaled, an optional mask, softmax over the last dim, an optional nn.Dropout),
then their product with v, become one call (flash or memory-efficient attention where the device has it: no
[L, S] score matrix in memory). timm's, nanoGPT's and most hand-written attention blocks read this way.
"""

from __future__ import annotations

import ast
import copy

from runner.proposers.rewrite.match import Ctx, Match, arg, literal
from runner.proposers.rewrite.rules import matmul_operands
from runner.proposers.rewrite.source import dotted

F = "torch.nn.functional"
NEG_INF = {"float('-inf')", 'float("-inf")', "-math.inf", "-torch.inf", "-float('inf')", '-float("inf")'}


def _chain(name: str, ctx: Ctx) -> tuple[ast.expr, list[ast.stmt]] | None:
    """The expression `name` holds at the statement, built from the `name = ...` statements right before it (each
    reading the previous), and those statements; None unless every read of the name is among them."""
    stmts: list[ast.stmt] = []
    expr: ast.expr = ast.Name(name, ast.Load())
    for s in reversed(ctx.body[: ctx.index]):
        if not (isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name)
                and s.targets[0].id == name):
            break
        stmts.append(s)
        expr = _substitute(expr, name, s.value)
        if not any(isinstance(n, ast.Name) and n.id == name for n in ast.walk(s.value)):
            reads = sum(1 for t in stmts + [ctx.body[ctx.index]] for n in ast.walk(t)
                        if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load))
            return (expr, stmts) if reads == ctx.f.loads.get(name, 0) else None
    return None


def _substitute(tree: ast.expr, name: str, value: ast.expr) -> ast.expr:
    class _Sub(ast.NodeTransformer):
        def visit_Name(self, n):  # noqa: N802 - ast's visitor naming
            return copy.deepcopy(value) if n.id == name else n

    return _Sub().visit(copy.deepcopy(tree))


def _dropout(node: ast.expr, ctx: Ctx) -> tuple[ast.expr, ast.expr | None]:
    """(inner, the nn.Dropout module) for `self.drop(inner)` where __init__ builds self.drop as nn.Dropout."""
    if isinstance(node, ast.Call) and len(node.args) == 1 and not node.keywords and ctx.f.cls is not None:
        target = dotted(node.func)
        for n in ast.walk(ctx.f.cls):
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) == target and target \
                    and isinstance(n.value, ast.Call) and ctx.qual(n.value.func) == "torch.nn.Dropout":
                return node.args[0], node.func
    return node, None


def _softmax_arg(node: ast.expr, ctx: Ctx) -> ast.expr | None:
    if not isinstance(node, ast.Call) or any(k.arg not in ("dim",) for k in node.keywords):
        return None
    q = ctx.qual(node.func)
    if q in ("torch.softmax", f"{F}.softmax") and node.args and literal(arg(node, 1, "dim")) == -1:
        return node.args[0]
    if q is None and isinstance(node.func, ast.Attribute) and node.func.attr == "softmax" and \
            literal(arg(node, 0, "dim")) == -1:
        return node.func.value
    return None


def _keys(node: ast.expr, ctx: Ctx) -> ast.expr | None:
    """k for k.transpose(-2, -1), k.transpose(-1, -2), k.mT (and transpose(2, 3) of a 4-D k)."""
    if isinstance(node, ast.Attribute) and node.attr == "mT":
        return node.value
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "transpose" and \
            ctx.qual(node.func) is None and len(node.args) == 2 and not node.keywords:
        dims = sorted(literal(a) for a in node.args if isinstance(literal(a), int))
        k = node.func.value
        if dims == [-2, -1] or (dims == [2, 3] and ctx.f.dims_of(k) == 4):
            return k
    return None


def _scores(node: ast.expr, ctx: Ctx) -> tuple[ast.expr, ast.expr, ast.expr] | None:
    """(q, k, scale) for (q @ k^T) * s, s * (q @ k^T), (q @ k^T) / s, q @ k^T."""
    scale: ast.expr = ast.Constant(1.0)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
        mm, s = node.left, node.right
        if isinstance(node.op, ast.Mult) and matmul_operands(s, ctx) and not matmul_operands(mm, ctx):
            mm, s = s, mm
        scale = s if isinstance(node.op, ast.Mult) else ast.BinOp(ast.Constant(1), ast.Div(), s)
        node = mm
    got = matmul_operands(node, ctx)
    if got is None or got[2] == "mm":
        return None
    k = _keys(got[1], ctx)
    return (got[0], k, scale) if k is not None else None


def attention(node: ast.expr, ctx: Ctx) -> Match | None:
    """probs @ v, probs = [dropout](softmax([mask](scale * q @ k^T), -1)): F.scaled_dot_product_attention."""
    mm = matmul_operands(node, ctx)
    if mm is None or mm[2] == "mm" or not isinstance(mm[0], ast.Name) or not ctx.body:
        return None
    probs, v, _ = mm
    got = _chain(probs.id, ctx)
    if got is None:
        return None
    expr, stmts = got
    expr, drop = _dropout(expr, ctx)
    scores = _softmax_arg(expr, ctx)
    mask = None
    if isinstance(scores, ast.Call) and isinstance(scores.func, ast.Attribute) and \
            scores.func.attr == "masked_fill" and len(scores.args) == 2 and ast.unparse(scores.args[1]) in NEG_INF:
        m = scores.args[0]
        mask = ast.Compare(m.left, [ast.NotEq()], m.comparators) if isinstance(m, ast.Compare) and \
            len(m.ops) == 1 and isinstance(m.ops[0], ast.Eq) else ast.UnaryOp(ast.Invert(), m)
        scores = scores.func.value
    elif isinstance(scores, ast.BinOp) and isinstance(scores.op, ast.Add):
        for s, m in ((scores.left, scores.right), (scores.right, scores.left)):
            if _scores(s, ctx) is not None:
                scores, mask = s, m
                break
    qks = _scores(scores, ctx) if scores is not None else None
    if qks is None or not all(ctx.f.pure(e) for e in (*qks, v, mask or v)):
        return None
    q, k, scale = qks
    kw = [ast.keyword("attn_mask", mask)] if mask is not None else []
    if drop is not None:
        kw.append(ast.keyword("dropout_p", ctx.build("D.p if self.training else 0.0", D=drop)))
    kw.append(ast.keyword("scale", scale))
    new = ctx.build("F.scaled_dot_product_attention(Q, K, V)", Q=q, K=k, V=v)
    new.keywords = kw
    return Match(new, "attention written out (scores, softmax, product with v) is F.scaled_dot_product_attention: "
                 "one fused kernel (flash or memory-efficient where the device has one), no score matrix in memory"
                 + ("; in training its dropout draws its own mask" if drop is not None else ""), drop=stmts)
