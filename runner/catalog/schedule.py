"""The scheduler: a graph with several heavy ops (GEMM, batched GEMM, convolution) becomes a sequence of stages.

Heavy ops stay on torch (cuBLAS/cuDNN); what lies between them is cut into fused programs, each lowered by the same
recognition as a whole graph (runner.catalog.recognition) on a sub-graph whose boundary values are its inputs:

    x ──linear──▶ h ──[bias + GELU: one program]──▶ g ──linear──▶ y        (a GPT-2 / Llama MLP)

A stage's tensors are the module's inputs and weights (the fast ABI's order) or earlier stages' results. A heavy op's
operand may be a view of one (reshape, permute, transpose: torch applies it, no copy is fused); any other computed
operand is materialised by the program that computes it. Views between a heavy op and a program are the program's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from runner.catalog.capture import CGraph, CNode
from runner.catalog.opset import translate

HEAVY_OPS = {"linear", "matmul", "addmm", "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d",
             "conv_transpose3d", "einsum"}
STAGE_OUTPUTS = 64  # outputs a stage may have (the encoding of a stage's result as an input index)
VIEWS = {"view", "expand", "permute", "t", "transpose", "identity", "unsqueeze", "squeeze"}


@dataclass
class Stage:
    """One step: `heavy` (a torch call) or `graph` (a fused program's sub-graph)."""

    kind: str  # heavy | fused
    node: CNode | None = None  # heavy: the op (translated), its tensor args as {"ref": ...}
    graph: CGraph | None = None  # fused: inputs are index >= 0 (ABI) or -1 - j (stage j's result)
    outputs: list[str] = field(default_factory=list)  # graph node names this stage produces, in order
    pattern: Any = None  # fused: its recognised Pattern (set by recognition)


@dataclass
class Plan:
    stages: list[Stage]
    outputs: list[dict]  # the module's outputs: {"abi": k} | {"stage": j, "out": m} with "views": [...]
    graph: CGraph | None = None  # the whole captured graph (heavy operands are read from it)


def heavy_nodes(g: CGraph) -> list[CNode]:
    nodes = [translate(n) for n in g.nodes]
    diag = {n.name for n in nodes if n.op == "diag"}
    return [n for n in nodes if n.op in HEAVY_OPS and not any(_ref(a) in diag for a in n.args)]


def needs_schedule(g: CGraph) -> bool:
    """Several heavy ops, work before one (its operand computed by other ops than views), or outputs of different
    sizes (one program each: RoPE of q and of k with fewer key heads)."""
    out = next((n for n in g.nodes if n.op == "output"), None)
    res = (out.args[0] if isinstance(out.args[0], list) else [out.args[0]]) if out is not None else []
    sizes = {_numel(g.node(r["ref"])) for r in res if isinstance(r, dict) and "ref" in r}
    if len(sizes) > 1:
        return True
    if _used_constants(g):
        return True
    heavy = heavy_nodes(g)
    if len(heavy) > 1:
        return True
    if not heavy:
        return False
    by = {n.name: translate(n) for n in g.nodes}
    return any(_source(by, _ref(a))[0].op not in ("input", "param") for a in heavy[0].args if _ref(a))


def _used_constants(g: CGraph) -> bool:
    """Does the graph read a constant tensor that no fast-ABI input carries (only a KernelBench candidate can)?"""
    names = {n.name for n in g.nodes if n.op == "constant_tensor" and not n.kwargs.get("structure")}
    return any(r in names for n in g.nodes if n.op != "constant_tensor" for r in _refs(n.args))


def _ref(a) -> str:
    return a["ref"] if isinstance(a, dict) and "ref" in a else ""


def _source(by: dict[str, CNode], name: str) -> tuple[CNode, list[CNode]]:
    """The node a chain of views starts from, and the views (outermost last)."""
    chain = []
    n = by[name]
    while n.op in VIEWS and n.args and _ref(n.args[0]):
        chain.append(n)
        n = by[_ref(n.args[0])]
    return n, chain[::-1]


def plan(g: CGraph) -> Plan:
    by = {n.name: translate(n) for n in g.nodes}
    order = [translate(n) for n in g.nodes]
    heavy = {n.name for n in heavy_nodes(g)}
    done: dict[str, dict] = {}  # node name -> how a later stage reads it: {"abi": k} | {"stage": j, "out": m}
    for n in order:
        if n.op in ("input", "param") or (n.op == "constant_tensor" and not n.kwargs.get("structure")):
            done[n.name] = {"abi": int(n.index)}
    stages: list[Stage] = []

    def materialise(names: list[str]) -> None:
        names = list(dict.fromkeys(x for x in names if x not in done))
        # one program has outputs of one shape: two of one size but different shapes ([B, D, 1] and [B, 1, T], the
        # two casts before transformers' rotary matmul) are two programs
        shapes = {tuple(by[x].shape or ()) for x in names}
        groups = [names] if len(shapes) == 1 else [[x] for x in names]
        for group in groups:
            if not group:
                continue
            j = len(stages)
            stages.append(Stage("fused", graph=_subgraph(g, by, group, done), outputs=group))
            for m, x in enumerate(group):
                done[x] = {"stage": j, "out": m}

    for n in order:
        if n.name not in heavy:
            continue
        srcs = [_source(by, _ref(a))[0].name for a in n.args if _ref(a)]
        materialise([s for s in srcs if s not in done and s not in heavy])
        stages.append(Stage("heavy", node=n, outputs=[n.name]))
        done[n.name] = {"stage": len(stages) - 1, "out": 0}
    out_node = next(n for n in order if n.op == "output")
    res = out_node.args[0] if isinstance(out_node.args[0], list) else [out_node.args[0]]
    finals = []
    for r in res:
        src, chain = _source(by, _ref(r))
        finals.append((src.name, chain))
    materialise([_ref(r) for r, (s, _) in zip(res, finals, strict=True) if s not in done])
    outs = []
    for r, (s, chain) in zip(res, finals, strict=True):
        if _ref(r) in done:
            outs.append({**done[_ref(r)], "views": []})
        else:
            outs.append({**done[s], "views": [_view_call(v) for v in chain]})
    return Plan(stages, outs, g)


def view_calls(g: CGraph, name: str) -> tuple[str, list[str]]:
    """A heavy operand as (the node it is a view of, the torch calls that make the view)."""
    by = {n.name: translate(n) for n in g.nodes}
    src, chain = _source(by, name)
    return src.name, [_view_call(v) for v in chain]


def _view_call(v: CNode) -> str:
    if v.op in ("view", "unsqueeze", "squeeze"):
        return f".reshape({tuple(v.shape or ())!r})"
    if v.op == "expand":
        return f".expand({tuple(v.shape or ())!r})"
    if v.op == "permute":
        return f".permute({tuple(v.args[1])!r})"
    if v.op == "t":
        return ".t()"
    if v.op == "transpose":
        return f".transpose({int(v.args[1])}, {int(v.args[2])})"
    return ""


def _subgraph(g: CGraph, by: dict[str, CNode], names: list[str], done: dict[str, dict]) -> CGraph:
    """The nodes that compute `names` from values already available (inputs, weights, earlier stages)."""
    keep: list[str] = []
    boundary: dict[str, CNode] = {}
    seen: set[str] = set()

    def visit(x: str) -> None:
        if x in seen:
            return
        seen.add(x)
        n = by[x]
        if x in done:
            ref = done[x]
            index = ref["abi"] if "abi" in ref else stage_abi(ref["stage"], ref["out"])
            op = "param" if n.op in ("param", "constant_tensor") else "input"
            boundary[x] = CNode(name=x, op=op, index=index, shape=n.shape, dtype=n.dtype, kwargs=dict(n.kwargs))
            return
        for a in _refs(n.args) + _refs(list(n.kwargs.values())):
            visit(a)
        keep.append(x)

    for x in names:
        visit(x)
    nodes = list(boundary.values()) + [g.node(x) for x in keep]
    nodes.append(CNode(name="output", op="output", args=[[{"ref": x} for x in names]]))
    return CGraph(nodes=nodes, n_inputs=g.n_inputs, params=g.params, param_shapes=g.param_shapes, tracer=g.tracer)


def stage_abi(stage: int, out: int) -> int:
    """The input index a program reads stage `stage`'s output `out` under (negative: not an ABI tensor)."""
    return -1 - (stage * STAGE_OUTPUTS + out)


def stage_of(abi: int) -> tuple[int, int]:
    """(stage, output) of a negative input index."""
    return divmod(-1 - abi, STAGE_OUTPUTS)


def _numel(n: CNode) -> int:
    out = 1
    for x in n.shape or ():
        out *= x
    return out


def _refs(args) -> list[str]:
    out = []
    for a in args:
        if isinstance(a, dict) and "ref" in a:
            out.append(a["ref"])
        elif isinstance(a, list):
            out += _refs(a)
    return out
