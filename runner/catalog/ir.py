"""The catalog's program: outputs computed over an iteration space F, optionally reduced along a block of dims.

    y[o, i]    = Red(x[o, :, i])                           (a row program with row-level output)
    y[o, r, i] = f(x[o, r, i], ..., Red_1, ..., Red_k)     (a row program with full-level output)
    y[f]       = f(x[f], ...)                              (an elementwise program: no reduced dims)

F is split as [O, R, I] around the reduced dims (contiguous dims `axes`). Expressions are immutable trees; equal trees
are the same value (structural sharing gives common-subexpression elimination for free in codegen).

Nodes a template must render (each raises NotExpressible where it cannot):
- Load(k): input k at the current position of F (its access kind says how: Program.access).
- Const(v), Dim(name): a number; a size read at run time ('R', or 'F0', 'F1', ...).
- Op(name, args, attrs): scalar math in fp32 (runner.catalog.codegen.common.op_code is the reference rendering).
  Its names are runner.catalog.ops's table: among them `where(c, a, b)` (c != 0 ? a : b); comparisons `eq ne lt le gt ge`
  (1.0 or 0.0); `not` (x == 0); `trunc`; `round_bf16` / `round_fp16`: x rounded to the nearest bf16/fp16 value
  (ties to even) and widened back to fp32, exactly where the reference stores to that type (an op whose result is
  bf16, `.to(torch.bfloat16)`); loads of bf16/fp16 widen exactly and the final store rounds; `idivmod(x; div, mod)`
  = (x // div) % mod on an integer value (an index range through a reshape that merged dims).
- Iota(e): the coordinate of the current position along F's dim `ndim - 1 - e` (counted from the innermost, as
  broadcasting aligns shapes), as a float: arange/iota, and a causal mask buffer whose structure the capture checked
  (`col <= row` is `le(Iota(0), Iota(1))`). An Iota along a reduced dim is full-level (it varies along the row);
  along any other dim, row-level. Rendered by runner.catalog.codegen.index (fb_iota, fb_coord).
- Red(kind, arg): a reduction over the reduced dims (a per-row value).
- Gather(base, index, stride): input base.k read at the current position (its view has size 1 along the gathered
  dim) plus (long long)index * stride elements: embedding, index_select, gather (a target's logit in
  cross-entropy). Its level is its base's or its index's.
- Total(kind, arg): 'sum' or 'max' over every row of a per-row value (a mean of per-row losses): the program's
  output is then one scalar. Rendered after all rows: the per-row values of arg, then their reduction in a fixed
  order.
A program may have several outputs (`Program.more`: a residual sum and its norm), all of one level (full or per
row), written by the same pass: output 0 is `out`, the others follow in order, each with its dtype.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from math import prod
from typing import TYPE_CHECKING

from runner.catalog import ops

if TYPE_CHECKING:
    from runner.catalog.rope import Rope


@dataclass(frozen=True)
class Expr:
    pass


@dataclass(frozen=True)
class Load(Expr):
    k: int  # position among the program's inputs


@dataclass(frozen=True)
class Const(Expr):
    value: float


@dataclass(frozen=True)
class Dim(Expr):
    """A size known at run time: 'R' (elements per reduced row) or an F dim 'F0', 'F1', ..."""

    name: str


@dataclass(frozen=True)
class Iota(Expr):
    """The coordinate along F's dim ndim - 1 - e (e counts from the innermost dim)."""

    e: int


@dataclass(frozen=True)
class Gather(Expr):
    """Input base.k at the current position plus index * stride elements (index: an integer-valued expression)."""

    base: Load
    index: Expr
    stride: int


@dataclass(frozen=True)
class Total(Expr):
    """A reduction ('sum', 'max', 'min') of a per-row value over every row: a scalar."""

    kind: str
    arg: Expr


@dataclass(frozen=True)
class Op(Expr):
    name: str
    args: tuple[Expr, ...]
    attrs: tuple[float, ...] = ()


@dataclass(frozen=True)
class Red(Expr):
    """A reduction of a full-level expression over the program's reduced dims: a per-row value.
    kind: sum, max, min, argmax, argmin, lse (log-sum-exp), mean, var (population)."""

    kind: str
    arg: Expr


REDUCTIONS = ("sum", "prod", "max", "min", "argmax", "argmin", "lse", "mean", "var")



@dataclass
class Input:
    """One program input: which ABI tensor it is, its view shape in F-space and its dtype."""

    abi: int  # index into the fast ABI's inputs (forward args, then state_dict)
    shape: tuple[int, ...]  # its broadcast shape, right-aligned to F (a view of its memory: same numel)
    dtype: str
    viewed: bool = False  # the shape is a fixed view (unsqueeze, diag as column) rather than the run-time shape
    # a strided view (slice, permute, cat): element at coordinates c (F's, right-aligned) is
    # offset + sum over dims d with shape[d] != 1 of clamp(c[d] - shift[d], 0, shape[d] - 1) * strides[d],
    # in a tensor of `base` elements; None for a plain (contiguous, broadcast) read
    strides: tuple[int, ...] | None = None
    offset: int = 0
    shift: tuple[int, ...] | None = None
    base: int = 0
    # a reshaped strided view (dims merged or split): the element is offset + sum over terms (d, div, mod, stride) of
    # ((c[d] // div) % mod) * stride, d a dim of `shape` (right-aligned to F); `strides` are then all 0, `shift` too
    terms: tuple[tuple[int, int, int, int], ...] | None = None
    tensor: tuple[int, ...] | None = None  # a viewed input: its ABI tensor's captured shape (runner.catalog.sizes)


@dataclass
class Output:
    """An output after the first: its expression (same level as the first), dtype and shape."""

    expr: Expr
    dtype: str
    shape: tuple[int, ...]


@dataclass
class Program:
    inputs: list[Input]
    out: Expr
    shape: tuple[int, ...]  # F, at capture time
    axes: tuple[int, ...] = ()  # reduced dims of F (contiguous); () for elementwise
    out_dtype: str = "float32"
    out_shape: tuple[int, ...] = ()
    notes: list[str] = field(default_factory=list)  # recognised patterns, in plain words
    more: list[Output] = field(default_factory=list)  # outputs 1, 2, ... (output 0 is `out`)
    # skipping (runner.catalog.skipping): each row reads only its first `limit` elements (a row-level expression,
    # clamped to [0, R]); past it every reduction's argument is the reduction's identity and every output is `beyond`.
    # A template may ignore both (the full computation gives the same values); None when nothing is provably skipped
    limit: Expr | None = None
    beyond: float = 0.0
    kept: tuple[Expr, Expr] | None = None  # with a limit: the mask's `where` and the branch it takes before the limit
    skip_zero: int | None = None  # input k: where it is 0 an element adds nothing to any sum (skipping.find_guard)
    # a rotary position embedding found in the captured graph (runner.catalog.rope): the `rope` template's program;
    # the expression above computes the same values for every other template
    rope: Rope | None = None

    @property
    def outputs(self) -> list[Output]:
        """Every output, the first included."""
        return [Output(self.out, self.out_dtype, self.out_shape), *self.more]

    @property
    def ndim(self) -> int:
        return len(self.shape)

    @property
    def is_row(self) -> bool:
        return bool(self.axes)

    def split(self) -> tuple[int, int, int]:
        """(O, R, I) at capture time."""
        if not self.axes:
            return prod(self.shape), 1, 1
        a, b = self.axes[0], self.axes[-1] + 1
        return prod(self.shape[:a]), prod(self.shape[a:b]), prod(self.shape[b:])

    def padded(self, k: int) -> tuple[int, ...]:
        s = self.inputs[k].shape
        return (1,) * (self.ndim - len(s)) + tuple(s)

    def access(self, k: int) -> str:
        """How input k is indexed: full (same shape as F), scalar, rowvec (varies only along the reduced dims),
        outer (varies only outside them), rowblock (constant inside a row over runs of block_len() elements, e.g. a
        GroupNorm's per-channel weight over a row of its group's channels), rowper (a row vector of the trailing
        reduced dims, repeating inside the row: a hinge loss's targets against a whole-tensor mean), strided (a view
        with its own strides, offset and shifts: Input.strides) or general (any other broadcast)."""
        s, f = self.padded(k), self.shape
        if self.inputs[k].strides is not None:
            return "strided"
        if prod(s) == 1:
            return "scalar"
        if s == f:
            return "full"
        ax = set(self.axes)
        if ax and all((s[d] == f[d]) if d in ax else s[d] == 1 for d in range(self.ndim)):
            return "rowvec"
        if ax and all((s[d] == 1) if d in ax else s[d] == f[d] for d in range(self.ndim)):
            return "outer"
        if self.block_split(k) is not None:
            return "rowblock"
        if self.period_split(k) is not None:
            return "rowper"
        return "general"

    def block_split(self, k: int) -> int | None:
        """For a row program's input that varies along a leading run of the reduced dims [a0, c) only (and along any
        outer dims, never the inner ones): c. Inside a row it then changes every block_len(c) elements, and its
        offset there is r // block_len (its dims after c are all 1). None for any other input."""
        if not self.axes:
            return None
        s, f = self.padded(k), self.shape
        a0, a1 = self.axes[0], self.axes[-1] + 1
        if any(s[d] != 1 for d in range(a1, self.ndim)) or any(s[d] not in (1, f[d]) for d in range(a0)):
            return None
        c = a0
        while c < a1 and s[c] == f[c]:
            c += 1
        return c if all(s[d] == 1 for d in range(c, a1)) else None

    def period_split(self, k: int) -> int | None:
        """For a row program's input that varies along a trailing run of the reduced dims [c, a1) only, a0 < c < a1
        (constant along the leading reduced dims and outside them): c. Inside a row its index is then r % P, P the
        product of the dims [c, a1). None for any other input."""
        if not self.axes:
            return None
        s, f = self.padded(k), self.shape
        a0, a1 = self.axes[0], self.axes[-1] + 1
        if any(s[d] != 1 for d in range(self.ndim) if d < a0 or d >= a1):
            return None
        c = a1
        while c > a0 and s[c - 1] == f[c - 1] != 1:
            c -= 1
        return c if a0 < c < a1 and all(s[d] == 1 for d in range(a0, c)) else None

    def block_len(self, k: int) -> int:
        """A rowblock input's run length inside a row at capture time."""
        c = self.block_split(k)
        assert c is not None
        return prod(self.shape[c:self.axes[-1] + 1])

    def load_is_full(self, k: int) -> bool:
        """Does input k vary along the reduced dims?"""
        s = self.padded(k)
        return any(s[d] != 1 for d in self.axes)

    def level(self, e: Expr) -> str:
        iotas = frozenset(Iota(self.ndim - 1 - d) for d in self.axes)
        return level(e, frozenset(k for k in range(len(self.inputs)) if self.load_is_full(k)), iotas)

    @property
    def has_totals(self) -> bool:
        """Is the output a scalar over every row (a Total)?"""
        return bool(totals(self.out))

    def out_is_row(self) -> bool:
        return self.is_row and self.level(self.out) == "row"

    def used_inputs(self) -> list[int]:
        return sorted({e.k for o in self.outputs for e in walk(o.expr) if isinstance(e, Load)})


def walk(e: Expr):
    """Every node of the tree, children first, each once."""
    seen: set[int] = set()
    stack: list[tuple[Expr, bool]] = [(e, False)]
    out = []
    while stack:
        node, done = stack.pop()
        if done:
            if id(node) not in seen:
                seen.add(id(node))
                out.append(node)
            continue
        stack.append((node, True))
        for c in children(node):
            stack.append((c, False))
    return out


def children(e: Expr) -> tuple[Expr, ...]:
    if isinstance(e, Op):
        return e.args
    if isinstance(e, Red | Total):
        return (e.arg,)
    if isinstance(e, Gather):
        return (e.base, e.index)
    return ()


def totals(e: Expr) -> list[Total]:
    out: list[Total] = []
    for n in walk(e):
        if isinstance(n, Total) and n not in out:
            out.append(n)
    return out


def rebuild(e: Expr, f) -> Expr:
    """e with every child c replaced by f(c) (a node of the same kind)."""
    if isinstance(e, Op):
        return Op(e.name, tuple(f(a) for a in e.args), e.attrs)
    if isinstance(e, Red):
        return Red(e.kind, f(e.arg))
    if isinstance(e, Total):
        return Total(e.kind, f(e.arg))
    if isinstance(e, Gather):
        base = f(e.base)
        assert isinstance(base, Load)
        return Gather(base, f(e.index), e.stride)
    return e


def reductions(e: Expr) -> list[Red]:
    out: list[Red] = []
    for n in walk(e):
        if isinstance(n, Red) and n not in out:
            out.append(n)
    return out


def level(e: Expr, full_loads: frozenset[int] | None = None, full_iotas: frozenset | None = None) -> str:
    """'full' when the value varies along the reduced dims (touches a Load or an Iota of a reduced dim outside a
    Red), else 'row'."""

    def rec(x: Expr) -> bool:
        if isinstance(x, Load):
            return full_loads is None or x.k in full_loads
        if isinstance(x, Iota):
            return full_iotas is None or x in full_iotas
        if isinstance(x, Red | Total):
            return False
        return any(rec(c) for c in children(x))

    return "full" if rec(e) else "row"


# ---- smart constructors: constant folding and identities -----------------------------------------------------


def op(name: str, *args: Expr, attrs: tuple[float, ...] = ()) -> Expr:
    """An Op, simplified where an identity or a constant is provable (x*1, x+0, x**1, relu(relu(x)), ...)."""
    a = args[0] if args else None
    b = args[1] if len(args) > 1 else None
    if name in ("add", "sub") and isinstance(b, Const) and b.value == 0.0:
        return a  # type: ignore[return-value]
    if name == "add" and isinstance(a, Const) and a.value == 0.0:
        return b  # type: ignore[return-value]
    if name in ("mul", "div") and isinstance(b, Const) and b.value == 1.0:
        return a  # type: ignore[return-value]
    if name == "mul" and isinstance(a, Const) and a.value == 1.0:
        return b  # type: ignore[return-value]
    if name == "sub" and a == b:
        return Const(0.0)
    if name == "powc" and attrs == (1.0,):
        return a  # type: ignore[return-value]
    if name == "powc" and attrs == (2.0,):
        return Op("square", (a,))  # type: ignore[arg-type]
    if name == "powc" and attrs == (3.0,):
        return Op("cube", (a,))  # type: ignore[arg-type]
    if name == "powc" and attrs == (0.5,):
        return Op("sqrt", (a,))  # type: ignore[arg-type]
    if name == "relu" and isinstance(a, Op) and a.name == "relu":
        return a
    if name in ("round_bf16", "round_fp16") and isinstance(a, Op) and a.name == name:
        return a  # a value rounded to a dtype is one of its values: rounding it again changes nothing
    if name == "where" and isinstance(a, Const):
        return args[1] if a.value != 0 else args[2]
    if all(isinstance(x, Const) for x in args) and args:
        folded = ops.fold(name, [x.value for x in args], attrs)  # type: ignore[union-attr]
        if folded is not None:
            return Const(folded)
    return Op(name, tuple(args), attrs)
