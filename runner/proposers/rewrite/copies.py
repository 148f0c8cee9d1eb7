"""Copies nothing needs: `.contiguous()` right before an op that reads any layout and returns a new contiguous
tensor, `.clone()` of a tensor only read by an op that returns a new one (in the expression, or under a name that
nothing writes), and a conversion repeated in a row (`x.float().float()`). Each rule is `(node, ctx) -> Match | None`
(runner/proposers/rewrite/match.py).
"""

from __future__ import annotations

import ast
import copy

from runner.proposers.rewrite.match import Ctx, Match
from runner.proposers.rewrite.source import plain, root_name

F = "torch.nn.functional"

# ---- copies ---------------------------------------------------------------------------------------------------

# ops that read any layout and return a new contiguous tensor: a .contiguous() on their operand only copies
LAYOUT_FREE = {"torch.matmul": (0, 1), "torch.mm": (0, 1), "torch.bmm": (0, 1), f"{F}.linear": (0, 1),
               "torch.softmax": (0,), f"{F}.softmax": (0,), "torch.log_softmax": (0,), f"{F}.log_softmax": (0,),
               f"{F}.layer_norm": (0,)}
LAYOUT_FREE_METHODS = {"matmul": (-1, 0), "mm": (-1, 0), "bmm": (-1, 0), "softmax": (-1,), "log_softmax": (-1,)}


def _contiguous(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "contiguous" \
            and not node.args and not node.keywords:
        return node.func.value
    return None


def _linear_modules(ctx: Ctx) -> set[str]:
    init = next((f for f in (ctx.f.cls.body if ctx.f.cls else []) if isinstance(f, ast.FunctionDef)
                 and f.name == "__init__"), None)
    out = set()
    for n in ast.walk(init) if init else ():
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.value, ast.Call) and \
                ctx.qual(n.value.func) == "torch.nn.Linear" and isinstance(n.targets[0], ast.Attribute):
            out.add(ast.unparse(n.targets[0]))
    return out


def contiguous_copy(node: ast.expr, ctx: Ctx) -> Match | None:
    """`.contiguous()` on an operand of matmul, linear, softmax or layer_norm: they read any layout and return a new
    contiguous tensor, so the copy changes nothing but the time."""
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        slots = [("left", None), ("right", None)]
    elif isinstance(node, ast.Call):
        q = ctx.qual(node.func)
        if q in LAYOUT_FREE:
            slots = [("args", k) for k in LAYOUT_FREE[q]]
        elif q is None and isinstance(node.func, ast.Attribute) and node.func.attr in LAYOUT_FREE_METHODS:
            slots = [("func", None) if k < 0 else ("args", k) for k in LAYOUT_FREE_METHODS[node.func.attr]]
        elif q is None and ast.unparse(node.func) in _linear_modules(ctx) and len(node.args) == 1:
            slots = [("args", 0)]
        else:
            return None
    else:
        return None
    new = copy.deepcopy(node)
    hit = False
    for field, k in slots:
        holder = new.func if field == "func" else new
        name = "value" if field == "func" else field
        cur = getattr(holder, name) if k is None else (holder.args[k] if k < len(holder.args) else None)
        inner = _contiguous(cur) if cur is not None else None
        if inner is not None:
            hit = True
            if k is None:
                setattr(holder, name, inner)
            else:
                holder.args[k] = inner
    if not hit:
        return None
    return Match(new, "`.contiguous()` copies a tensor right before an op that reads any layout and returns a new "
                 "contiguous tensor: the copy is removed")


REPEATABLE = {"float", "half", "double", "bfloat16", "contiguous", "detach", "to"}


def repeated_conversion(node: ast.expr, ctx: Ctx) -> Match | None:
    """x.float().float() is x.float() (and the same for half, double, bfloat16, contiguous, detach, .to(same))."""
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in REPEATABLE:
        inner = node.func.value
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and \
                inner.func.attr == node.func.attr and _arguments(inner) == _arguments(node) and \
                (node.func.attr != "to" or node.args or node.keywords):
            return Match(copy.deepcopy(inner), f"`.{node.func.attr}()` twice in a row: the second does nothing")
    return None


def _arguments(call: ast.Call) -> str:
    return ast.dump(ast.Call(func=ast.Name("f"), args=call.args, keywords=call.keywords))


# ops that return a new tensor and never write their inputs: a .clone() of an operand only copies
FRESH = {"exp", "log", "tanh", "sigmoid", "sqrt", "rsqrt", "abs", "relu", "softmax", "log_softmax", "matmul", "mm",
         "bmm", "sum", "mean", "add", "mul", "sub", "div", "pow", "square", "erf", "neg", "var", "std", "norm",
         "logsumexp", "masked_fill", "clamp", "amax", "amin", "cat", "stack", "where", "linear", "gelu", "silu",
         "layer_norm", "rms_norm", "einsum"}


def _clone(node: ast.AST) -> ast.expr | None:
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "clone" \
            and not node.args and not node.keywords:
        return node.func.value
    return None


def clone_copy(node: ast.expr, ctx: Ctx) -> Match | None:
    """`.clone()` of an operand of arithmetic or of an op that returns a new tensor and writes nothing: the copy is
    never mutated (it exists only inside the expression), so it is removed."""
    new = copy.deepcopy(node)
    hit = False
    if isinstance(new, ast.BinOp):
        for side in ("left", "right"):
            inner = _clone(getattr(new, side))
            if inner is not None:
                setattr(new, side, inner)
                hit = True
    elif isinstance(new, ast.Call) and not any(k.arg in ("inplace", "out") for k in new.keywords):
        q = ctx.qual(new.func)
        if q is not None and q.startswith(("torch.", F)) and q.rsplit(".", 1)[1] in FRESH:
            pass
        elif q is None and isinstance(new.func, ast.Attribute) and new.func.attr in FRESH:
            inner = _clone(new.func.value)
            if inner is not None:
                new.func.value, hit = inner, True
        else:
            return None
        for k, a in enumerate(new.args):
            for j, e in enumerate(a.elts if isinstance(a, ast.List | ast.Tuple) else [a]):
                inner = _clone(e)
                if inner is not None:
                    if isinstance(a, ast.List | ast.Tuple):
                        a.elts[j] = inner
                    else:
                        new.args[k] = inner
                    hit = True
    if not hit:
        return None
    return Match(new, "`.clone()` copies a tensor that is only read, by an op that returns a new tensor: the copy "
                 "is removed")


def _parents(fn: ast.AST) -> dict[int, ast.AST]:
    return {id(c): p for p in ast.walk(fn) for c in ast.iter_child_nodes(p)}


def _only_read(name: str, fn: ast.AST, ctx: Ctx) -> bool:
    """Every read of `name` in fn is an operand of arithmetic or of an op that returns a new tensor and writes
    nothing (so no alias of it escapes and nothing writes it)."""
    parents = _parents(fn)
    for n in ast.walk(fn):
        if not (isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)):
            continue
        p = parents.get(id(n))
        if isinstance(p, ast.BinOp | ast.Compare):
            continue
        if isinstance(p, ast.Attribute) and p.attr in FRESH and isinstance(parents.get(id(p)), ast.Call) \
                and parents[id(p)].func is p and not parents[id(p)].keywords:
            continue
        if isinstance(p, ast.Call) and n in p.args and not any(k.arg in ("inplace", "out") for k in p.keywords):
            q = ctx.qual(p.func)
            if q is not None and q.startswith(("torch.", F)) and q.rsplit(".", 1)[1] in FRESH:
                continue
        return False
    return True


def _never_written(root: str, fn: ast.AST, ctx: Ctx) -> bool:
    """No in-place method, item or attribute store, augmented assignment or unknown call touches `root` in fn."""
    for n in ast.walk(fn):
        if isinstance(n, ast.AugAssign | ast.Assign | ast.AnnAssign):
            targets = n.targets if isinstance(n, ast.Assign) else [n.target]
            if any(not isinstance(t, ast.Name) and root_name(t) == root for t in targets) or \
                    isinstance(n, ast.AugAssign) and root_name(n.target) == root:
                return False
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr.endswith("_") and \
                root_name(n.func.value) == root:
            return False
        if isinstance(n, ast.Call) and any(root_name(a) == root for a in n.args + [k.value for k in n.keywords]) \
                and not ctx.f.pure(n):
            return False
    return True


def named_clone(node: ast.expr, ctx: Ctx) -> Match | None:
    """`y = x.clone()` where y is only read by ops that return new tensors and x is never written: y can be x."""
    inner = _clone(node)
    stmt = ctx.body[ctx.index] if ctx.body else None
    if inner is None or not isinstance(stmt, ast.Assign) or stmt.value is not node or len(stmt.targets) != 1 or \
            not isinstance(stmt.targets[0], ast.Name) or ctx.f.stores.get(stmt.targets[0].id) != 1:
        return None
    root = root_name(inner)
    fn = ctx.f.node
    if root is None or not plain(inner) or not _only_read(stmt.targets[0].id, fn, ctx) or \
            not _never_written(root, fn, ctx):
        return None
    return Match(copy.deepcopy(inner), f"`{stmt.targets[0].id} = {ast.unparse(node)}` copies a tensor that neither it "
                 "nor its copy is ever written: the copy is removed")
