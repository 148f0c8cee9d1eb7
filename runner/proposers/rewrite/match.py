"""Finding rewrite sites: every simple statement of every reachable function, its expressions outermost first, with
single-use temporaries seen through (`e = torch.exp(x - m)` then `e / e.sum(-1, keepdim=True)` is one softmax).

A rule is a function `(node, ctx) -> Match | None`. A match's dims conditions are checked against what the source
shows (runner/proposers/rewrite/source.py); an unknown one becomes a guard (`new if x.dim() == 1 else old`) where the
tested expression is plain, else the match is dropped. A temporary the match folded in goes (its statement is deleted)
only when every read of it is inside the match.
"""

from __future__ import annotations

import ast
import copy
import logging
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from runner.proposers.rewrite.edit import Edit
from runner.proposers.rewrite.source import Func, plain, root_name, same

log = logging.getLogger(__name__)

SIMPLE = (ast.Assign, ast.AnnAssign, ast.AugAssign, ast.Return, ast.Expr)


@dataclass
class Match:
    """What a rule found: the new expression, what must hold (expression, dims it must have: 1, or -2 for "2 or
    more"), and the words an idea says."""

    new: ast.expr
    words: str
    dims: list[tuple[ast.expr, int]] = field(default_factory=list)
    drop: list[ast.stmt] = field(default_factory=list)  # statements the new expression takes the place of
    # tested at run time whatever the source shows (shapes and dtypes where the original refuses what the new
    # expression broadcasts or promotes), over the plain expressions `reads`
    guards: list[ast.expr] = field(default_factory=list)
    reads: list[ast.expr] = field(default_factory=list)
    precondition: str = ""  # what must hold that no guard can test cheaply (the values), stated in the PR


@dataclass
class Site:
    """One rewrite: its rule, its words, its edits, its line."""

    rule: str
    words: str
    edits: list[Edit]
    line: int
    old: str
    new: str
    precondition: str = ""

    @property
    def lines(self) -> str:
        """"line 17", or "lines 20-24" where statements folded into it go too."""
        first, last = min(e.at[0] for e in self.edits), max(e.at[2] for e in self.edits)
        return f"line {first}" if first == last else f"lines {first}-{last}"


class Ctx:
    """A rule's view of one statement: the function's facts, the temporaries before it, and the file's names."""

    def __init__(self, f: Func, temps: dict[str, tuple[ast.expr, ast.stmt]], body: list[ast.stmt] | None = None,
                 index: int = 0):
        self.f, self.temps = f, temps
        self.body, self.index = body or [], index  # the statement's block and its place there
        self.used: set[str] = set()
        mod = f.module
        self.torch = mod.name_of("torch")
        self.F = mod.name_of("torch.nn.functional") or (f"{self.torch}.nn.functional" if self.torch else None)

    def r(self, node: ast.AST) -> ast.AST:
        """The node, or the value of the temporary it names (recorded as folded in)."""
        while isinstance(node, ast.Name) and node.id in self.temps:
            self.used.add(node.id)
            node = self.temps[node.id][0]
        return node

    def expand(self, node: ast.AST) -> ast.AST:
        """The node with every temporary replaced by its value (for comparisons; records nothing)."""
        temps = self.temps

        class _In(ast.NodeTransformer):
            def visit_Name(self, n):  # noqa: N802 - ast's visitor naming
                return self.visit(copy.deepcopy(temps[n.id][0])) if n.id in temps else n

        return _In().visit(copy.deepcopy(node))

    def same(self, a: ast.AST, b: ast.AST) -> bool:
        return same(self.expand(a), self.expand(b))

    def qual(self, node: ast.AST) -> str | None:
        return self.f.qual(node)

    def call(self, node: ast.AST, *names: str) -> ast.Call | None:
        """The node (through temporaries) if it calls one of `names` (dotted origins), else None."""
        node = self.r(node)
        return node if isinstance(node, ast.Call) and self.qual(node.func) in names else None

    def method(self, node: ast.AST, *names: str) -> ast.Call | None:
        """The node (through temporaries) if it is `<tensor>.<name>(...)` for one of `names`."""
        node = self.r(node)
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in names \
                and self.qual(node.func) is None:
            return node
        return None

    def build(self, template: str, **subs: ast.AST) -> ast.expr:
        """An expression from a template: `T` is torch's name here, `F` torch.nn.functional's, other capitals the
        given subtrees."""
        text = template.replace("T.", f"{self.torch}.").replace("F.", f"{self.F}.")
        tree = ast.parse(text, mode="eval").body

        class _Sub(ast.NodeTransformer):
            def visit_Name(self, n):  # noqa: N802
                return copy.deepcopy(subs[n.id]) if n.id in subs else n

        return _Sub().visit(tree)


def literal(node: ast.AST | None) -> object:
    """The value of a constant (negative numbers included), else a marker that equals nothing."""
    if isinstance(node, ast.Constant):
        return node.value
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub) and isinstance(node.operand, ast.Constant):
        return -node.operand.value
    return object()


def arg(call: ast.Call, pos: int, name: str) -> ast.expr | None:
    """A call's argument by position or keyword."""
    for k in call.keywords:
        if k.arg == name:
            return k.value
    return call.args[pos] if len(call.args) > pos else None


def bodies(node: ast.AST) -> Iterator[list[ast.stmt]]:
    """Every statement list inside a function, nested blocks included, nested functions and classes not."""
    for name in ("body", "orelse", "finalbody"):
        block = getattr(node, name, None)
        if isinstance(block, list) and block and isinstance(block[0], ast.stmt):
            yield block
            for s in block:
                if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef | ast.Lambda):
                    yield from bodies(s)
    for h in getattr(node, "handlers", []):
        yield from bodies(h)


def _stored(stmts: list[ast.stmt]) -> set[str]:
    return {n.id for s in stmts for n in ast.walk(s) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)}


def _writes(f: Func, stmts: list[ast.stmt]) -> set[str] | None:
    """The names these statements may write in place (the root of an item or attribute store, an augmented
    assignment, an in-place method, an argument of a call that is not pure); None: anything (an inplace/out call)."""
    out: set[str] = set()
    for s in stmts:
        for n in ast.walk(s):
            if isinstance(n, ast.Subscript | ast.Attribute) and isinstance(n.ctx, ast.Store | ast.Del) or \
                    isinstance(n, ast.AugAssign):
                out.add(root_name(n.target if isinstance(n, ast.AugAssign) else n) or "")
            elif isinstance(n, ast.Call):
                if any(k.arg in ("inplace", "out") for k in n.keywords):
                    return None
                if isinstance(n.func, ast.Attribute) and n.func.attr.endswith("_"):
                    out.add(root_name(n.func.value) or "")
                if not f.pure(n):
                    out |= {root_name(a) or "" for a in n.args + [k.value for k in n.keywords]}
    return out


def temporaries(f: Func, body: list[ast.stmt], i: int) -> dict[str, tuple[ast.expr, ast.stmt]]:
    """Names bound once in the function by `name = <pure expression>` earlier in this block, none of whose inputs is
    rebound or written in place before its use in statement i."""
    out = {}
    for j, s in enumerate(body[:i]):
        if isinstance(s, ast.Assign) and len(s.targets) == 1 and isinstance(s.targets[0], ast.Name) and \
                f.stores.get(s.targets[0].id) == 1 and f.pure(s.value):
            reads = {n.id for n in ast.walk(s.value) if isinstance(n, ast.Name)}
            written = _writes(f, body[j + 1: i + 1])
            if written is not None and not reads & (_stored(body[j + 1: i]) | written):
                out[s.targets[0].id] = (s.value, s)
    return out


def _loads(node: ast.AST, name: str) -> int:
    return sum(1 for n in ast.walk(node) if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load))


def folded(f: Func, node: ast.AST, new: ast.AST, ctx: Ctx) -> list[ast.stmt]:
    """The statements of the temporaries the match folded in that nothing else reads, the new expression included."""
    drop = {n for n in ctx.used if n in ctx.temps and not _loads(new, n)}
    while True:
        keep = {n for n in drop
                if _loads(node, n) + sum(_loads(ctx.temps[m][0], n) for m in drop) < f.loads.get(n, 0)}
        if not keep:
            return [ctx.temps[n][1] for n in sorted(drop)]
        drop -= keep


Rule = Callable[[ast.expr, Ctx], Match | None]


def _viewed(node: ast.expr) -> bool:
    """A plain expression, or a transpose of one (`x.t()`, `x.T`, `x.mT`): reading it twice costs a view."""
    if isinstance(node, ast.Attribute) and node.attr in ("T", "mT"):
        return _viewed(node.value)
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "t" \
            and not node.args and not node.keywords:
        return _viewed(node.func.value)
    return plain(node)


def _guarded(m: Match, node: ast.expr, ctx: Ctx) -> tuple[ast.expr, str] | None:
    """The match's expression with guards for the dims the source does not show; None when one is shown wrong or
    cannot be tested."""
    tests = []
    if m.guards and not all(_viewed(e) and not (isinstance(e, ast.Name) and e.id in ctx.temps) for e in m.reads):
        return None
    for expr, want in m.dims:
        known = ctx.f.dims_of(expr)
        if known is not None:
            if (want > 0 and known != want) or (want < 0 and known < -want):
                return None
            continue
        if not plain(expr) or (isinstance(expr, ast.Name) and expr.id in ctx.temps):
            return None
        tests.append(ctx.build(f"E.dim() == {want}" if want > 0 else f"E.dim() >= {-want}", E=expr))
    tests += m.guards  # after the dims: a guard may index a shape the dims tests make sure of
    if not tests:
        return m.new, ""
    flat = [v for t in tests for v in (t.values if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And) else [t])]
    test = flat[0] if len(flat) == 1 else ast.BoolOp(op=ast.And(), values=flat)
    ctx.used.clear()  # the original stays as the other branch, and with it the temporaries it reads
    shown = " and ".join(ast.unparse(t) for t in tests)
    return ast.IfExp(test=test, body=m.new, orelse=copy.deepcopy(node)), f" (guarded: only where {shown}, which the " \
        "source does not show; otherwise the original expression)"


def scan(f: Func, rules: list[tuple[str, Rule]]) -> list[Site]:
    """Every site of every rule in one reachable function."""
    sites: list[Site] = []
    for body in bodies(f.node):
        for i, stmt in enumerate(body):
            if isinstance(stmt, SIMPLE):
                temps = temporaries(f, body, i)
                for child in ast.iter_child_nodes(stmt):
                    if isinstance(child, ast.expr):
                        _visit(child, f, (temps, body, i), rules, sites)
    return sites


def _visit(node: ast.expr, f: Func, where: tuple, rules: list[tuple[str, Rule]], sites: list[Site]) -> None:
    if isinstance(node, ast.Lambda | ast.ListComp | ast.GeneratorExp | ast.DictComp | ast.SetComp):
        return
    for name, rule in rules:
        ctx = Ctx(f, *where)
        if ctx.torch is None:
            return
        try:
            m = rule(node, ctx)
        except Exception:  # noqa: BLE001 - a rule's bug costs its rewrite, never the search
            log.warning("rewrite: rule %s failed on line %d", name, node.lineno, exc_info=True)
            continue
        if m is None:
            continue
        g = _guarded(m, node, ctx)
        if g is None:
            continue
        new, note = g
        if note and m.drop:
            continue  # the original, the guard's other branch, needs the statements the rewrite would remove
        edits = [Edit.of(node, new)] + [Edit.of(s) for s in folded(f, node, new, ctx) + m.drop]
        sites.append(Site(name, m.words + note, edits, node.lineno, ast.unparse(node), ast.unparse(new),
                          m.precondition))
        return
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.expr):
            _visit(child, f, where, rules, sites)
