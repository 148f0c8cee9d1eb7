"""C code shared by the CUDA and C++ templates: the plan of passes over a row, scalar math for every op, the
expression emitter and input index expressions (the fixed C text every source starts with is in head.py).

A row program's reductions run in passes: all accumulators whose arguments need only earlier passes share one
loop over the row. `online` turns log-sum-exp into one pass (running max and rescaled sum) and mean+variance into one
pass (Welford); `twopass` computes the max (or mean) first and the sum of exp(x - max) (or of squares of x - mean)
in a second pass: exact and cheap when the row stays in cache.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from runner.catalog import ops
from runner.catalog.codegen.index import coord_code, strided_index_code
from runner.catalog.ir import Const, Dim, Expr, Gather, Iota, Load, Op, Program, Red, Total, rebuild, reductions, walk

CTYPE_CUDA = {"float32": "float", "float16": "__half", "bfloat16": "__nv_bfloat16", "float64": "double",
              "int64": "long long", "int32": "int", "bool": "bool", "uint8": "unsigned char", "int8": "signed char"}
CTYPE_CPU = {"float32": "float", "float16": "fb_f16", "bfloat16": "fb_bf16", "float64": "double",
             "int64": "long long", "int32": "int", "bool": "bool",
             "uint8": "unsigned char", "int8": "signed char"}


class NotExpressible(Exception):  # noqa: N818 - this template cannot express this program
    pass


@dataclass(frozen=True)
class AccRef(Expr):
    """The value of a finished reduction (a per-row scalar), by its C variable name."""

    name: str


@dataclass
class Acc:
    name: str
    kind: str  # AccSum AccMax AccMin AccArgMax AccArgMin AccLse AccWelford
    arg: Expr  # full-level, may hold AccRefs of earlier passes
    pass_no: int


@dataclass
class Value:
    name: str
    code: str  # C expression over accumulators
    pass_no: int
    is_int: bool = False


@dataclass
class Plan:
    accs: list[Acc] = field(default_factory=list)
    values: list[Value] = field(default_factory=list)
    out: Expr | None = None  # the output with every Red replaced by an AccRef
    more: list[Expr] = field(default_factory=list)  # the program's other outputs, the same way
    passes: int = 0


def plan_passes(p: Program, mode: str) -> Plan:
    """Accumulators and finished values, pass by pass (mode: 'online' or 'twopass')."""
    plan = Plan()
    done: dict[Red, Expr] = {}
    keyed: dict[tuple, Acc] = {}
    pass_of: dict[str, int] = {}

    def acc(kind: str, arg: Expr) -> Acc:
        key = (kind, arg)
        if key not in keyed:
            refs = [x for x in walk(arg) if isinstance(x, AccRef)]
            pno = 1 + max((pass_of[r.name] for r in refs), default=0)
            a = Acc(f"acc{len(plan.accs)}", kind, arg, pno)
            keyed[key] = a
            plan.accs.append(a)
        return keyed[key]

    def value(code: str, pno: int, is_int: bool = False) -> AccRef:
        v = Value(f"rv{len(plan.values)}", code, pno, is_int)
        plan.values.append(v)
        pass_of[v.name] = pno
        return AccRef(v.name)

    softmax: dict[tuple[Expr, AccRef], Expr] = {}  # (x, its lse) -> exp(x - lse) as exp(x - max) * (1 / sum)
    reds: list[Red] = []
    for o in p.outputs:
        reds += [r for r in reductions(o.expr) if r not in reds]
    # online: a mean beside a variance of the same argument is the Welford accumulator's own mean (one accumulator and
    # one block reduction, not a sum beside it)
    welford_args = {r.arg for r in reds if r.kind == "var"} if mode == "online" else set()
    for red in reds:
        arg = replace_reds(red.arg, done)
        k = red.kind
        if k == "mean" and red.arg in welford_args:
            a = acc("AccWelford", arg)
            done[red] = value(f"(float){a.name}.mean", a.pass_no)
        elif k in ("sum", "mean"):
            a = acc("AccSum", arg)
            done[red] = value(f"(float){a.name}.s" + (" / (float)a.R" if k == "mean" else ""), a.pass_no)
        elif k == "prod":
            a = acc("AccProd", arg)
            done[red] = value(f"(float){a.name}.p", a.pass_no)
        elif k in ("max", "min"):
            a = acc("AccMax" if k == "max" else "AccMin", arg)
            done[red] = value(f"{a.name}.m", a.pass_no)
        elif k in ("argmax", "argmin"):
            a = acc("AccArgMax" if k == "argmax" else "AccArgMin", arg)
            done[red] = value(f"{a.name}.i", a.pass_no, is_int=True)
        elif k == "lse" and mode == "online":
            a = acc("AccLse", arg)
            done[red] = value(f"({a.name}.m + logf((float){a.name}.s))", a.pass_no)
        elif k == "lse":
            m = acc("AccMax", arg)
            mv = value(f"{m.name}.m", m.pass_no)
            e = Op("exp", (Op("sub", (arg, mv)),))
            s = acc("AccSum", e)
            done[red] = value(f"({mv.name} + logf((float){s.name}.s))", s.pass_no)
            # softmax's exp(x - lse) is exp(x - max) / sum: the exponential its sum pass already took (a template
            # that keeps it in registers computes one exp per element), times the sum's reciprocal
            softmax[(arg, done[red])] = Op("mul", (e, value(f"(1.0f / (float){s.name}.s)", s.pass_no)))
        elif k == "var" and mode == "online":
            a = acc("AccWelford", arg)
            done[red] = value(f"(float)({a.name}.m2 / {a.name}.n)", a.pass_no)
        elif k == "var":
            m = acc("AccSum", arg)
            mv = value(f"(float){m.name}.s / (float)a.R", m.pass_no)
            s = acc("AccSum", Op("square", (Op("sub", (arg, mv)),)))
            done[red] = value(f"(float){s.name}.s / (float)a.R", s.pass_no)
        else:
            raise NotExpressible(f"reduction {k}")
    plan.out = _softmax_exp(replace_reds(p.out, done), softmax)
    plan.more = [_softmax_exp(replace_reds(o.expr, done), softmax) for o in p.more]
    plan.passes = max((a.pass_no for a in plan.accs), default=0)
    return plan


def _softmax_exp(e: Expr, softmax: dict[tuple[Expr, AccRef], Expr]) -> Expr:
    """e with every exp(x - lse(x)) of a two-pass log-sum-exp as exp(x - max) * (1 / sum)."""
    if not softmax:
        return e
    if isinstance(e, Op) and e.name == "exp" and isinstance(e.args[0], Op) and e.args[0].name == "sub":
        found = softmax.get((e.args[0].args[0], e.args[0].args[1]))
        if found is not None:
            return found
    if isinstance(e, Op | Gather | Total):
        return rebuild(e, lambda c: _softmax_exp(c, softmax))
    return e


def replace_reds(e: Expr, done: dict[Red, Expr]) -> Expr:
    if isinstance(e, Red):
        return done[e]
    if isinstance(e, Op | Gather | Total):
        return rebuild(e, lambda c: replace_reds(c, done))
    return e


# ---- scalar code ---------------------------------------------------------------------------------------------


def float_literal(v: float) -> str:
    """A float as a C literal (NAN, INFINITY spelled out)."""
    return _f(v)


def _f(v: float) -> str:
    if v != v:
        return "NAN"
    if v in (float("inf"), float("-inf")):
        return "INFINITY" if v > 0 else "(-INFINITY)"
    return f"{float(v)!r}f".replace("inff", "INFINITY")


def op_code(name: str, a: list[str], attrs: tuple[float, ...]) -> str:
    """The C expression of a scalar op (runner.catalog.ops)."""
    code = ops.render(name, a, attrs, _f)
    if code is None:
        raise NotExpressible(f"op {name}")
    return code


INT_COMPARE = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}


class Emitter:
    """Emits `const float tN = ...;` lines for an expression; equal sub-trees are computed once."""

    def __init__(self, load, ref=lambda name: name, prefix: str = "t", gather=None, ints: frozenset = frozenset(),
                 iota=None):
        """load(k): an input's element at the current position; gather(k, extra): the same plus `extra` elements
        (None: this template cannot render a Gather); ints: the integer inputs (a Gather's index read from one is
        an integer throughout); iota(e): an Iota's coordinate as a long long (None: from the flat position)."""
        self.load, self.ref, self.prefix, self.gather, self.ints = load, ref, prefix, gather, ints
        self.iota = iota or (lambda e: f"fb_iota(a, FB_ND - 1 - {e.e}, flat)")
        self.lines: list[str] = []
        self.memo: dict[Expr, str] = {}

    def __call__(self, e: Expr) -> str:
        if e in self.memo:
            return self.memo[e]
        if isinstance(e, Const):
            return _f(e.value)
        if isinstance(e, AccRef):
            return self.ref(e.name)
        if isinstance(e, Dim):
            code = "(float)a.R" if e.name == "R" else f"(float)a.F[{int(e.name[1:])}]"
            return code
        if isinstance(e, Load):
            code = self.load(e.k)
        elif isinstance(e, Gather):
            if self.gather is None:
                raise NotExpressible("a load indexed by a tensor (Gather)")
            code = self.gather(e.base.k, f" + {self.index(e.index)} * {e.stride}LL")
        elif isinstance(e, Iota):
            code = f"(float){self.iota(e)}"
        elif isinstance(e, Op) and e.name in INT_COMPARE and all(isinstance(x, Iota) for x in e.args):
            # a causal mask's col <= row: compared as integers (no conversion to float per element, exact at any size)
            code = f"(float)({self.iota(e.args[0])} {INT_COMPARE[e.name]} {self.iota(e.args[1])})"
        elif isinstance(e, Op):
            code = op_code(e.name, [self(x) for x in e.args], e.attrs)
        else:
            raise NotExpressible(f"{type(e).__name__} in an element expression")
        name = f"{self.prefix}{len(self.memo)}"
        self.lines.append(f"const float {name} = {code};")
        self.memo[e] = name
        return name

    def index(self, e: Expr) -> str:
        """A Gather's index as a long long: an integer input's element (position ids, token ids) and an Iota's
        coordinate never pass through a float, which holds integers exactly only below 2^24."""
        if isinstance(e, Iota):
            return self.iota(e)
        if isinstance(e, Load) and e.k in self.ints:
            raw = _unwrapped(self.load(e.k))
            if raw is not None:
                return f"(long long)({raw})"
        return f"(long long){self(e)}"


def _unwrapped(code: str) -> str | None:
    """X from a load `fb_f(X)` (CUDA) or `(float)X` (C++, X a postfix expression): the element before its conversion
    to float."""
    if code.startswith("(float)"):
        return code[len("(float)"):]
    if code.startswith("fb_f(") and code.endswith(")"):
        inner, depth = code[len("fb_f("):-1], 0
        for ch in inner:
            depth += {"(": 1, ")": -1}.get(ch, 0)
            if depth < 0:
                return None
        return inner if depth == 0 else None
    return None


def counter_spans(p: Program) -> tuple[int, int] | None:
    """The dims a row template's o, r and i count ([0, a0), [a0, a1), [a1, ndim)); None for an elementwise program."""
    return (p.axes[0], p.axes[-1] + 1) if p.is_row and p.axes else None


def counter_iota(p: Program, spans: tuple[int, int]):
    """An Iota's coordinate from counters o, r, i (`spans`): along the traversed dim the loop counter itself, along
    the outer dims a value of the row only (computed once per row by the compiler)."""
    return lambda e: coord_code(p, p.ndim - 1 - e.e, spans)


def integer_inputs(p: Program) -> frozenset:
    return frozenset(k for k, i in enumerate(p.inputs) if i.dtype in ("int64", "int32", "int8", "uint8", "bool"))


def index_code(p: Program, k: int, spans: tuple[int, int] | None = None) -> str:
    """The element index of input k at (o, r, i, flat); `spans`: the dims o, r and i count (a row template's, or a
    flat kernel's inside one innermost row): a strided view's index from them, not divided out of the flat
    position (runner.catalog.codegen.index)."""
    kind = p.access(k)
    if kind == "rowblock":
        return f"(fb_obase(a, {k}, o) + (long long)fb_rbq(a, {k}, r))"
    if kind == "rowper":
        return f"fb_rper(a, {k}, r)"
    if kind == "strided":
        return strided_index_code(p, k, spans)
    general = f"fb_bidx_row(a, {k}, {spans[0]}, {spans[1]}, o, r, i)" if spans else f"fb_bidx(a, {k}, flat)"
    return {"full": "flat", "scalar": "0", "rowvec": "r", "outer": "(o * a.I + i)"}.get(kind, general)


def signature(p: Program) -> str:
    """A one-line summary of the program for comments: shapes, axes, inputs."""
    ins = ", ".join(f"in{inp.abi}{list(inp.shape)}:{p.access(k)}" for k, inp in enumerate(p.inputs))
    return f"F={list(p.shape)} axes={list(p.axes)} inputs: {ins or 'none'} -> {p.out_dtype}{list(p.out_shape)}"


def stored(e, dtype: str):
    """`e` as an output of `dtype` is written: without a last rounding to that dtype, which the store itself does the
    same way (round to nearest even, NaN and infinities kept), so a bf16 output is converted once, not three times."""
    if isinstance(e, Op) and e.name == ops.ROUND_TO.get(dtype):
        return e.args[0]
    return e


def full_output(p: Program) -> bool:
    return not p.is_row or p.level(p.out) == "full"


def uses_general(p: Program) -> bool:
    return any(p.access(k) == "general" for k in range(len(p.inputs)))


def int_output(p: Program) -> bool:
    return p.out_dtype in ("int64", "int32")


def row_result(p: Program, plan: Plan, em: Emitter) -> str:
    """A per-row output's value: an argmax/argmin index is stored as it is, anything else as float math."""
    if isinstance(plan.out, AccRef) and int_output(p):
        return plan.out.name
    if int_output(p):
        raise NotExpressible("integer arithmetic on a reduction index")
    assert plan.out is not None
    return em(plan.out)


def red_kinds(p: Program) -> set[str]:
    return {r.kind for r in reductions(p.out)}
