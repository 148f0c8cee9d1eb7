"""What the source rewrites read: the functions a module's forward reaches in its own file, and what is known of each
name there (imports, tensor dims from constructors, unpacking, views, shape comments and annotations, purity).
Edits to the text are runner/proposers/rewrite/edit.py's.
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

# calls that neither mutate nor draw random numbers: an expression made of these (and names, attributes, constants,
# arithmetic) may be evaluated once instead of twice, or moved next to its single use
PURE_MODULES = ("torch.", "math.")
IMPURE = {"torch.nn.functional.dropout", "torch.dropout", "torch.rand", "torch.randn", "torch.randint",
          "torch.rand_like", "torch.randn_like", "torch.bernoulli", "torch.multinomial", "torch.normal"}
PURE_METHODS = {
    "float", "half", "double", "bfloat16", "to", "contiguous", "view", "reshape", "transpose", "permute", "t", "mT",
    "unsqueeze", "squeeze", "flatten", "expand", "sum", "mean", "max", "min", "amax", "amin", "pow", "exp", "log",
    "tanh", "sigmoid", "sqrt", "rsqrt", "abs", "clamp", "clamp_min", "clamp_max", "softmax", "log_softmax", "matmul",
    "mm", "bmm", "mul", "add", "sub", "div", "neg", "var", "std", "square", "erf", "relu", "size", "dim", "type_as",
    "logsumexp", "detach", "clone", "values", "chunk", "split", "norm", "reciprocal", "masked_fill",
}
# torch constructors whose positional sizes give the result's dims
SIZED = {"torch.rand", "torch.randn", "torch.ones", "torch.zeros", "torch.empty", "torch.full"}
SAME_DIMS_METHODS = {"float", "half", "double", "bfloat16", "to", "contiguous", "clone", "detach", "exp", "log",
                     "tanh", "sigmoid", "sqrt", "rsqrt", "abs", "clamp", "pow", "neg", "relu", "square", "type_as",
                     "transpose", "permute", "t", "softmax", "log_softmax", "masked_fill"}

_SHAPE_COMMENT = re.compile(r"\b([A-Za-z_]\w*)\s*:\s*(?:[A-Za-z]\w*)?\[([^\]]*)\]")


def imports_of(tree: ast.Module) -> dict[str, str]:
    """Module-level import aliases: local name -> dotted origin ("F" -> "torch.nn.functional")."""
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.Import):
            for a in node.names:
                if a.asname:
                    out[a.asname] = a.name
                else:
                    out[a.name.split(".")[0]] = a.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            for a in node.names:
                out[a.asname or a.name] = f"{node.module}.{a.name}"
    return out


def dotted(node: ast.AST) -> str | None:
    """`a.b.c` as text, None for anything but names and attributes."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def same(a: ast.AST | None, b: ast.AST | None) -> bool:
    return a is not None and b is not None and ast.dump(a) == ast.dump(b)


def root_name(node: ast.AST) -> str | None:
    while isinstance(node, ast.Attribute | ast.Subscript):
        node = node.value
    return node.id if isinstance(node, ast.Name) else None


def plain(node: ast.AST) -> bool:
    """A name, an attribute chain, or one subscripted by constants: reading it twice gives the same tensor."""
    if isinstance(node, ast.Name):
        return True
    if isinstance(node, ast.Attribute):
        return plain(node.value)
    if isinstance(node, ast.Subscript):
        return plain(node.value) and all(isinstance(n, ast.Constant | ast.Slice | ast.Tuple | ast.expr_context |
                                                    ast.UnaryOp | ast.unaryop | ast.Load)
                                         for n in ast.walk(node.slice))
    return False


@dataclass
class Func:
    """One reachable function: its class (None for a module-level helper), its node, and what is known in it."""

    cls: ast.ClassDef | None
    node: ast.FunctionDef
    module: Module
    dims: dict[str, int] = field(default_factory=dict)  # names (and "self.attr") of known tensor dims
    stores: dict[str, int] = field(default_factory=dict)  # name -> how many times the function binds it
    loads: dict[str, int] = field(default_factory=dict)

    def qual(self, node: ast.AST) -> str | None:
        """The dotted origin of a callee: `F.silu` -> "torch.nn.functional.silu", `torch.exp` -> "torch.exp"."""
        d = dotted(node)
        if d is None:
            return None
        head, _, rest = d.partition(".")
        origin = self.module.imports.get(head)
        if origin is None:
            return None
        return f"{origin}.{rest}" if rest else origin

    def is_call(self, node: ast.AST, *names: str) -> bool:
        return isinstance(node, ast.Call) and self.qual(node.func) in names

    def pure(self, node: ast.AST) -> bool:
        """Every call in it is a torch or math function or a tensor method that neither mutates nor draws."""
        for n in ast.walk(node):
            if isinstance(n, ast.Call):
                q = self.qual(n.func)
                if q is not None:
                    if not q.startswith(PURE_MODULES) or q in IMPURE or q.endswith("_"):
                        return False
                elif not (isinstance(n.func, ast.Attribute) and n.func.attr in PURE_METHODS):
                    return False
                if any(k.arg in ("inplace", "out") for k in n.keywords):
                    return False
            elif isinstance(n, ast.NamedExpr | ast.Lambda | ast.Yield | ast.Await):
                return False
        return True

    def dims_of(self, node: ast.AST) -> int | None:
        """The dims of a tensor expression where the source shows them, else None."""
        if isinstance(node, ast.Name):
            return self.dims.get(node.id)
        if isinstance(node, ast.Attribute) and dotted(node) and dotted(node).startswith("self."):
            return self.dims.get(dotted(node))
        if isinstance(node, ast.Attribute) and node.attr in ("T", "mT", "mH"):
            return self.dims_of(node.value)
        if isinstance(node, ast.BinOp):
            a, b = self.dims_of(node.left), self.dims_of(node.right)
            if isinstance(node.left, ast.Constant):
                return b
            if isinstance(node.right, ast.Constant):
                return a
            return max(a, b) if a is not None and b is not None else None
        if isinstance(node, ast.UnaryOp):
            return self.dims_of(node.operand)
        if not isinstance(node, ast.Call):
            return None
        q = self.qual(node.func)
        if q in ("torch.nn.Parameter", "torch.nn.parameter.Parameter") and node.args:
            return self.dims_of(node.args[0])
        if q in SIZED:
            sizes = node.args[:1] if q == "torch.full" else node.args
            if len(sizes) == 1 and isinstance(sizes[0], ast.Tuple | ast.List):
                return len(sizes[0].elts) if not any(isinstance(e, ast.Starred) for e in sizes[0].elts) else None
            if sizes and not any(isinstance(e, ast.Starred) for e in sizes) and q != "torch.full":
                return len(sizes)
            return None
        if q in ("torch.arange", "torch.linspace"):
            return 1
        if q == "torch.eye":
            return 2
        if isinstance(node.func, ast.Attribute) and q is None:
            m, base = node.func.attr, node.func.value
            if m in SAME_DIMS_METHODS:
                return self.dims_of(base)
            if m in ("view", "reshape") and node.args and not any(isinstance(a, ast.Starred) for a in node.args):
                if len(node.args) == 1 and isinstance(node.args[0], ast.Tuple):
                    return len(node.args[0].elts)
                return len(node.args) if not isinstance(node.args[0], ast.Tuple | ast.Attribute) else None
        return None


class Module:
    """A parsed module file and the functions its target class's forward reaches in it."""

    def __init__(self, text: str, class_name: str):
        self.text, self.class_name = text, class_name
        self.tree = ast.parse(text)
        self.imports = imports_of(self.tree)
        self.classes = {n.name: n for n in self.tree.body if isinstance(n, ast.ClassDef)}
        self.functions = {n.name: n for n in self.tree.body if isinstance(n, ast.FunctionDef)}
        self.funcs: list[Func] = self._reachable()

    def name_of(self, origin: str) -> str | None:
        """How this file spells a module or function it may not import by that name ("torch.nn.functional")."""
        for local, o in sorted(self.imports.items()):
            if o == origin:
                return local
        for local, o in sorted(self.imports.items()):
            if origin.startswith(o + "."):
                return local + origin[len(o):]
        return None

    def _methods(self, cls: ast.ClassDef) -> dict[str, ast.FunctionDef]:
        out: dict[str, ast.FunctionDef] = {}
        for base in cls.bases:  # a base class of this file: its methods are the subclass's unless overridden
            if isinstance(base, ast.Name) and base.id in self.classes and base.id != cls.name:
                out.update(self._methods(self.classes[base.id]))
        out.update({f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)})
        return out

    def _reachable(self) -> list[Func]:
        """The target's forward, the methods and module functions it calls, and the forwards of this file's
        classes its __init__ builds (submodules), transitively."""
        if self.class_name not in self.classes:
            return []
        todo: list[tuple[ast.ClassDef | None, str]] = [(self.classes[self.class_name], "forward")]
        seen: set[int] = set()
        out: list[Func] = []
        while todo:
            cls, name = todo.pop()
            methods = self._methods(cls) if cls is not None else {}
            fn = methods.get(name) if cls is not None else self.functions.get(name)
            if fn is None or id(fn) in seen:
                continue
            seen.add(id(fn))
            out.append(self._func(cls, fn, methods.get("__init__")))
            for n in ast.walk(fn):
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in self.functions:
                    todo.append((None, n.func.id))
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and cls is not None \
                        and isinstance(n.func.value, ast.Name) and n.func.value.id == "self":
                    todo.append((cls, n.func.attr))
            if cls is not None and name == "forward" and "__init__" in methods:
                for n in ast.walk(methods["__init__"]):
                    if isinstance(n, ast.Name) and n.id in self.classes:
                        todo.append((self.classes[n.id], "forward"))
        return sorted(out, key=lambda f: f.node.lineno)

    def _func(self, cls: ast.ClassDef | None, fn: ast.FunctionDef, init: ast.FunctionDef | None) -> Func:
        f = Func(cls, fn, self)
        for n in ast.walk(fn):
            if isinstance(n, ast.Name):
                d = f.stores if isinstance(n.ctx, ast.Store | ast.Del) else f.loads
                d[n.id] = d.get(n.id, 0) + 1
        for a in fn.args.posonlyargs + fn.args.args + fn.args.kwonlyargs:
            f.stores[a.arg] = f.stores.get(a.arg, 0) + 1
            k = _annotated_dims(a.annotation)
            if k is not None:
                f.dims[a.arg] = k
        for line in _comments(self.text, fn):
            for name, inner in _SHAPE_COMMENT.findall(line):
                items = [s for s in re.split(r"[,\s]+", inner.strip()) if s]
                if items and not any("..." in s or s.startswith("*") for s in items):
                    f.dims.setdefault(name, len(items))
        if init is not None:
            g = Func(cls, init, self)
            counts: dict[str, int] = {}
            for n in ast.walk(init):
                if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and dotted(n):
                    counts[dotted(n)] = counts.get(dotted(n), 0) + 1
            for n in ast.walk(init):
                if isinstance(n, ast.Assign) and len(n.targets) == 1 and dotted(n.targets[0]) and \
                        dotted(n.targets[0]).startswith("self.") and counts.get(dotted(n.targets[0])) == 1:
                    k = g.dims_of(n.value)
                    if k is not None:
                        f.dims[dotted(n.targets[0])] = k
                if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and \
                        n.func.attr in ("register_buffer", "register_parameter") and len(n.args) >= 2 and \
                        isinstance(n.args[0], ast.Constant) and isinstance(n.args[0].value, str):
                    k = g.dims_of(n.args[1])
                    if k is not None and counts.get(f"self.{n.args[0].value}", 0) == 0:
                        f.dims[f"self.{n.args[0].value}"] = k
        for n in ast.walk(fn):  # `B, N, C = x.shape` (raises unless x has exactly 3 dims); `assert x.dim() == 2`
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Tuple) and \
                    isinstance(n.value, ast.Attribute) and n.value.attr == "shape" and \
                    isinstance(n.value.value, ast.Name) and f.stores.get(n.value.value.id) == 1 and \
                    not any(isinstance(e, ast.Starred) for e in n.targets[0].elts):
                f.dims[n.value.value.id] = len(n.targets[0].elts)
            if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name) and \
                    f.stores.get(n.targets[0].id) == 1:
                k = f.dims_of(n.value)
                if k is not None:
                    f.dims[n.targets[0].id] = k
        return f


def _annotated_dims(ann: ast.AST | None) -> int | None:
    """jaxtyping's `Float[Tensor, "b n d"]`: three dims."""
    if isinstance(ann, ast.Subscript) and isinstance(ann.slice, ast.Tuple) and len(ann.slice.elts) == 2:
        spec = ann.slice.elts[1]
        if isinstance(spec, ast.Constant) and isinstance(spec.value, str):
            items = spec.value.split()
            if not any("..." in s or "*" in s for s in items):
                return len(items)
    return None


def _comments(text: str, fn: ast.FunctionDef) -> list[str]:
    """The comments inside a function's lines (gpt-fast style shape comments: `# x: [B, H, S, D]`)."""
    lines = text.splitlines()[fn.lineno - 1: fn.end_lineno]
    return [line.split("#", 1)[1] for line in lines if "#" in line]
