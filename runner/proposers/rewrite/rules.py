"""The algebraic and library rewrites, each only where it is equivalent: diag products, softmax and log-softmax,
RMSNorm and LayerNorm written out, a matmul plus bias. Activations are found by value
(runner/proposers/rewrite/activations.py), copies nothing needs in runner/proposers/rewrite/copies.py. Each rule is
`(node, ctx) -> Match | None` (runner/proposers/rewrite/match.py).
"""

from __future__ import annotations

import ast

import torch

from runner.proposers.rewrite.match import Ctx, Match, arg, literal
from runner.proposers.rewrite.source import plain

F = "torch.nn.functional"
HAS_RMS_NORM = hasattr(torch.nn.functional, "rms_norm")  # torch 2.4 and later


def matmul_operands(node: ast.AST, ctx: Ctx) -> tuple[ast.expr, ast.expr, str] | None:
    """(A, B, how) for `A @ B`, torch.matmul/mm(A, B) and A.matmul/mm(B)."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        return node.left, node.right, "@"
    if isinstance(node, ast.Call) and not node.keywords:
        q = ctx.qual(node.func)
        if q in ("torch.matmul", "torch.mm") and len(node.args) == 2:
            return node.args[0], node.args[1], q.split(".")[1]
        if q is None and isinstance(node.func, ast.Attribute) and node.func.attr in ("matmul", "mm") \
                and len(node.args) == 1:
            return node.func.value, node.args[0], node.func.attr
    return None


DIAG_FINITE = ("`{x}` holds no inf or NaN: where it does, the original's matmul multiplies it by the diagonal's "
               "zeros and spreads NaN along that {side}, and the rewrite does not")


def diag_product(node: ast.expr, ctx: Ctx) -> Match | None:
    """diag(a) @ B is a[:, None] * B (a 1-D, B 2+-D); B @ diag(a) is B * a."""
    mm = matmul_operands(node, ctx)
    if mm is None:
        return None
    a, b, how = mm
    why = "a diagonal matrix product is a broadcast multiply: no N×N matrix is built and no matmul runs"
    d = ctx.call(a, "torch.diag")
    if d is not None and len(d.args) == 1 and not d.keywords:
        v = d.args[0]
        # the matmul refuses what the multiply would broadcast (a 1-D B, a B of other rows) or promote (dtypes)
        guard = ctx.build("B.dim() >= 2 and B.shape[-2] == V.shape[0] and B.dtype == V.dtype", B=b, V=v)
        return Match(ctx.build("V[:, None] * B", V=v, B=b), f"diag(a) @ B is a[:, None] * B: {why}", [(v, 1)],
                     guards=[guard], reads=[b, v], precondition=DIAG_FINITE.format(x=ast.unparse(b), side="column"))
    ctx.used.clear()
    d = ctx.call(b, "torch.diag")
    if d is not None and len(d.args) == 1 and not d.keywords:
        v = d.args[0]
        guard = ctx.build("A.dim() >= 1 and A.shape[-1] == V.shape[0] and A.dtype == V.dtype", A=a, V=v)
        return Match(ctx.build("A * V", A=a, V=v), f"B @ diag(a) is B * a: {why}", [(v, 1)], guards=[guard],
                     reads=[a, v], precondition=DIAG_FINITE.format(x=ast.unparse(a), side="row"))
    ctx.used.clear()
    d = ctx.call(a, "torch.diag_embed")  # a batch of diagonals: [..., N] -> [..., N, N]
    if d is not None and len(d.args) == 1 and not d.keywords and how != "mm":
        return Match(ctx.build("V.unsqueeze(-1) * B", V=d.args[0], B=b), "diag_embed(a) @ B is a.unsqueeze(-1) * B: "
                     + why, [(b, -2)])
    ctx.used.clear()
    d = ctx.call(b, "torch.diag_embed")
    if d is not None and len(d.args) == 1 and not d.keywords and how != "mm":
        return Match(ctx.build("A * V.unsqueeze(-2)", A=a, V=d.args[0]), "B @ diag_embed(a) is B * a.unsqueeze(-2): "
                     + why, [(a, -2)])
    return None


def _reduction(node: ast.AST, ctx: Ctx, names: tuple[str, ...]) -> tuple[ast.expr, object] | None:
    """(tensor, dim) of a keepdim reduction `torch.<name>(t, dim, keepdim=True)` or `t.<name>(dim, keepdim=True)`;
    a max may be indexed [0] or .values, and detached."""
    node = ctx.r(node)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "detach":
        node = ctx.r(node.func.value)
    if isinstance(node, ast.Subscript) and literal(node.slice) == 0 or \
            isinstance(node, ast.Attribute) and node.attr == "values":
        if "max" not in names:
            return None
        node = ctx.r(node.value)
    if not isinstance(node, ast.Call):
        return None
    q = ctx.qual(node.func)
    if q is not None and q.startswith("torch.") and q.split(".", 1)[1] in names and node.args:
        t, dim, keep = node.args[0], arg(node, 1, "dim"), arg(node, 2, "keepdim")
    elif q is None and isinstance(node.func, ast.Attribute) and node.func.attr in names:
        t, dim, keep = node.func.value, arg(node, 0, "dim"), arg(node, 1, "keepdim")
    else:
        return None
    if literal(keep) is not True or not isinstance(literal(dim), int):
        return None
    return t, literal(dim)


def softmax(node: ast.expr, ctx: Ctx) -> Match | None:
    """exp(x - max(x, d)) / sum(exp(x - max(x, d)), d) is torch.softmax(x, dim=d) (the subtracted max optional)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div)):
        return None
    e = ctx.call(node.left, "torch.exp") or ctx.method(node.left, "exp")
    den = _reduction(node.right, ctx, ("sum",))
    if e is None or den is None or not ctx.same(den[0], node.left):
        return None
    z = ctx.r(e.args[0] if ctx.qual(e.func) else e.func.value)
    x, d = z, den[1]
    if isinstance(z, ast.BinOp) and isinstance(z.op, ast.Sub):
        m = _reduction(z.right, ctx, ("max", "amax"))
        if m is not None:
            if m[1] != d or not ctx.same(m[0], z.left):
                return None
            x = z.left
    if not ctx.f.pure(x):
        return None
    return Match(ctx.build(f"T.softmax(X, dim={d})", X=x), "a softmax written out (exp of the shifted input over "
                 "its sum) is torch.softmax: one kernel, no exp temporaries, the max subtracted inside")


def log_softmax(node: ast.expr, ctx: Ctx) -> Match | None:
    """x - logsumexp(x, d, keepdim=True) is torch.log_softmax(x, dim=d)."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Sub)):
        return None
    lse = _reduction(node.right, ctx, ("logsumexp",))
    if lse is None or not ctx.same(lse[0], node.left) or not ctx.f.pure(node.left):
        return None
    return Match(ctx.build(f"T.log_softmax(X, dim={lse[1]})", X=node.left),
                 "x - logsumexp(x) is torch.log_softmax: one kernel instead of a reduction and a subtraction")


def _factors(node: ast.AST, num: list, den: list) -> None:
    """The factors of a product/quotient: numerator and denominator."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult):
        _factors(node.left, num, den)
        _factors(node.right, num, den)
    elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
        _factors(node.left, num, den)
        _factors(node.right, den, num)
    else:
        num.append(node)


def _root_of_mean(node: ast.AST, ctx: Ctx, num: list, den: list) -> tuple[ast.expr, ast.expr] | None:
    """(S, the factor) where the product holds rsqrt(S) or 1/sqrt(S); removes that factor."""
    for side, fn in ((num, "rsqrt"), (den, "sqrt")):
        for k, f in enumerate(side):
            c = ctx.call(f, f"torch.{fn}") or ctx.method(f, fn)
            if c is not None:
                del side[k]
                return ctx.r(c.args[0] if ctx.qual(c.func) else c.func.value), f
    return None


def _square_of(node: ast.AST, ctx: Ctx) -> ast.expr | None:
    """x for x.pow(2), x ** 2, x * x, torch.pow(x, 2), x.square(), torch.square(x)."""
    node = ctx.r(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Pow) and literal(node.right) == 2:
        return node.left
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult) and ctx.same(node.left, node.right):
        return node.left
    if isinstance(node, ast.Call):
        q = ctx.qual(node.func)
        if q in ("torch.pow", "torch.square") and node.args and (q == "torch.square" or literal(arg(node, 1, "exponent")) == 2):
            return node.args[0]
        if q is None and isinstance(node.func, ast.Attribute) and (
                node.func.attr == "square" or node.func.attr == "pow" and node.args and literal(node.args[0]) == 2):
            return node.func.value
    return None


def _last_dim(x: ast.expr, d: object, ctx: Ctx) -> bool:
    k = ctx.f.dims_of(x)
    return d == -1 or (k is not None and d == k - 1)


def _plus_eps(node: ast.AST, ctx: Ctx) -> tuple[ast.expr, ast.expr] | None:
    """(V, eps) for V + eps or eps + V, eps a constant or a plain name."""
    node = ctx.r(node)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        for v, eps in ((node.left, node.right), (node.right, node.left)):
            if isinstance(eps, ast.Constant) or plain(eps) and not isinstance(ctx.r(eps), ast.Call):
                return v, eps
    return None


def rms_norm(node: ast.expr, ctx: Ctx) -> Match | None:
    """x * rsqrt(mean(x², -1, keepdim) + eps) [* w] is F.rms_norm(x, (x.shape[-1],), w, eps)."""
    if not HAS_RMS_NORM or not isinstance(node, ast.BinOp) or not isinstance(node.op, ast.Mult | ast.Div):
        return None
    num: list = []
    den: list = []
    _factors(node, num, den)
    found = _root_of_mean(node, ctx, num, den)
    split = _plus_eps(found[0], ctx) if found else None
    mean = _reduction(split[0], ctx, ("mean",)) if split else None
    x = _square_of(mean[0], ctx) if mean else None
    if x is None or den or not plain(x) or not _last_dim(x, mean[1], ctx):
        return None
    rest = [f for f in num if not ctx.same(f, x)]
    if len(num) - len(rest) != 1 or len(rest) > 1 or (rest and not plain(rest[0])):
        return None
    w = rest[0] if rest else ast.Constant(None)
    return Match(ctx.build("F.rms_norm(X, (X.shape[-1],), W, EPS)", X=x, W=w, EPS=split[1]),
                 "an RMSNorm written out (x times the reciprocal root of its mean square) is F.rms_norm "
                 "(torch 2.4 and later): one kernel instead of a square, a mean, an rsqrt and the products")


def layer_norm(node: ast.expr, ctx: Ctx) -> Match | None:
    """(x - mean) / sqrt(var + eps) [* w] [+ b] over the last dim is F.layer_norm(x, (x.shape[-1],), w, b, eps)."""
    bias = None
    body = node
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        for p, b in ((node.left, node.right), (node.right, node.left)):
            if isinstance(p, ast.BinOp) and isinstance(p.op, ast.Mult | ast.Div) and plain(b):
                body, bias = p, b
                break
    if not isinstance(body, ast.BinOp) or not isinstance(body.op, ast.Mult | ast.Div):
        return None
    num: list = []
    den: list = []
    _factors(body, num, den)
    found = _root_of_mean(body, ctx, num, den)
    split = _plus_eps(found[0], ctx) if found else None
    if split is None or den:
        return None
    centred = [f for f in num if isinstance(ctx.r(f), ast.BinOp) and isinstance(ctx.r(f).op, ast.Sub)]
    if len(centred) != 1:
        return None
    c = ctx.r(centred[0])
    mu = _reduction(c.right, ctx, ("mean",))
    if mu is None or not ctx.same(mu[0], c.left) or not plain(c.left) or not _last_dim(c.left, mu[1], ctx):
        return None
    x, d = c.left, mu[1]
    if not _variance(split[0], x, c, d, ctx):
        return None
    rest = [f for f in num if f is not centred[0]]
    if len(rest) > 1 or (rest and not plain(rest[0])):
        return None
    w = rest[0] if rest else ast.Constant(None)
    return Match(ctx.build("F.layer_norm(X, (X.shape[-1],), W, B, EPS)", X=x, W=w, B=bias or ast.Constant(None),
                           EPS=split[1]),
                 "a LayerNorm written out (centred, divided by the root of the variance plus eps, scaled and "
                 "shifted) is F.layer_norm: one kernel instead of two reductions and the elementwise steps")


def _variance(v: ast.AST, x: ast.expr, centred: ast.BinOp, d: object, ctx: Ctx) -> bool:
    """v is the biased variance of x over d: x.var(d, keepdim=True, unbiased=False) or the mean of (x - mean)²."""
    v = ctx.r(v)
    if isinstance(v, ast.Call) and (ctx.qual(v.func) == "torch.var" or ctx.qual(v.func) is None and
                                    isinstance(v.func, ast.Attribute) and v.func.attr == "var"):
        method = ctx.qual(v.func) is None
        t = v.func.value if method else (v.args[0] if v.args else None)
        dim = arg(v, 0 if method else 1, "dim")
        kw = {k.arg: literal(k.value) for k in v.keywords}
        biased = kw.get("unbiased") is False or kw.get("correction") == 0
        return t is not None and ctx.same(t, x) and literal(dim) == d and kw.get("keepdim") is True and biased \
            and len(v.args) <= (1 if method else 2)
    m = _reduction(v, ctx, ("mean",))
    sq = _square_of(m[0], ctx) if m else None
    return sq is not None and m[1] == d and ctx.same(sq, centred)


def linear_bias(node: ast.expr, ctx: Ctx) -> Match | None:
    """x @ W.t() + b is F.linear(x, W, b) (W 2-D, b 1-D): the bias added inside the GEMM."""
    if not (isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add)):
        return None
    for mm_side, b in ((node.left, node.right), (node.right, node.left)):
        mm = matmul_operands(mm_side, ctx)
        if mm is None or mm[2] == "mm" or not plain(b):
            continue
        x, wt, _ = mm
        w = None
        if isinstance(wt, ast.Attribute) and wt.attr == "T":
            w = wt.value
        elif isinstance(wt, ast.Call) and isinstance(wt.func, ast.Attribute) and ctx.qual(wt.func) is None and (
                wt.func.attr == "t" and not wt.args or
                wt.func.attr == "transpose" and sorted(map(literal, wt.args)) in ([0, 1], [-2, -1])):
            w = wt.func.value
        if w is None or not plain(w):
            continue
        return Match(ctx.build("F.linear(X, W, B)", X=x, W=w, B=b), "a matmul by a transposed weight plus a bias "
                     "is F.linear: one GEMM with the bias added in it (addmm) instead of a matmul and an add",
                     [(w, 2), (b, 1)])
    return None
