"""Rotary position embeddings recognised in the captured graph, for the `rope` template (runner.catalog.codegen.cuda.rope).

Each output is `x * cos + rot(x) * sin` over the first `rot` features of the last dim of x, the rest of x passed
through (`cat([that, x[..., rot:]], -1)`: GPT-NeoX's rotary_pct, GPT-J's rotary_dim), where rot is one of

- half (transformers' rotate_half: Llama, Mistral, Qwen2, GPT-NeoX): `cat([-x[..., h:], x[..., :h]], -1)`, h = rot / 2;
- pairs (GPT-J's rotate_every_two): `stack([-x[..., 1::2], x[..., ::2]], -1).flatten(-2)`, which the capture shows as
  slices of step 2, a neg, unsqueezes, a cat along a new last dim and a view.

cos and sin (a `Table` each) must be an input read through size-1 dims only (unsqueeze, expand, view), or a row of a
table gathered by an index tensor and split along its last dim (GPT-J's `embed_positions[position_ids]`), each
optionally repeated element by element (repeat_interleave(2) as unsqueeze, expand, clone, view). Nothing is taken
from a module's name: any graph of these ops is a rotary embedding, and any other is not (the general templates
then serve it). Every output has the shape of its x (a contiguous input), all outputs one shape (one program).
"""

from __future__ import annotations

from dataclasses import dataclass
from math import prod

from runner.catalog.capture import CGraph, CNode
from runner.catalog.opset import translate

PEEL = ("unsqueeze", "expand", "identity", "view", "squeeze")
END = 9223372036854775807


@dataclass(frozen=True)
class Table:
    """cos or sin: element (row, j) of the rotated part is tensor `abi` at row_offset(row) + col + (j // 2 if
    interleave else j), row_offset = sum over F's row dims d of coordinate_d * strides[d] (elements; 0 where it is
    broadcast); with `index` set, row_offset is index_tensor[that sum] * width instead (a gathered table row)."""

    abi: int
    strides: tuple[int, ...]  # per F dim but the last
    col: int = 0
    interleave: bool = False
    index: int | None = None  # ABI position of the index tensor (int64)
    width: int = 0  # the gathered table's row length


@dataclass(frozen=True)
class Rope:
    style: str  # half | pairs
    shapes: tuple[tuple[int, ...], ...]  # per output (its x's shape); the last dim is the head dim, the same for all
    rot: int  # features rotated (the first ones); the others pass through
    xs: tuple[int, ...]  # per output, the ABI position of its x
    cos: Table
    sin: Table
    tensors: tuple[tuple[int, tuple[int, ...], str], ...] = ()  # every tensor read: (ABI position, shape, dtype)
    dtype: str = "float32"  # of x and of every output

    @property
    def head(self) -> int:
        return self.shapes[0][-1]

    @property
    def one_shape(self) -> bool:
        """Every output of one shape (one program; a thread then writes the same vector of each)."""
        return len(set(self.shapes)) == 1

    def rows(self, o: int = 0) -> int:
        return prod(self.shapes[o][:-1])


class _Graph:
    def __init__(self, g: CGraph):
        self.by = {n.name: translate(n) for n in g.nodes}

    def node(self, a) -> CNode | None:
        return self.by.get(a["ref"]) if isinstance(a, dict) and "ref" in a else None

    def dim(self, n: CNode, i: int) -> int:
        nd = len(n.shape or ())
        return (int(n.args[i]) + nd) % nd if nd else 0

    def slice_of(self, n: CNode | None) -> tuple[CNode, int, int, int] | None:
        """(source, start, stop, step) of a slice along the last dim."""
        if n is None or n.op != "slice" or len(n.args) < 2:
            return None
        src = self.node(n.args[0])
        if src is None or self.dim(n, 1) != len(src.shape) - 1:
            return None
        last = src.shape[-1]
        start = int(n.args[2]) if len(n.args) > 2 and n.args[2] is not None else 0
        stop = int(n.args[3]) if len(n.args) > 3 and n.args[3] is not None else END
        step = int(n.args[4]) if len(n.args) > 4 else 1
        return src, max(start, 0), min(stop, last), step


def find(g: CGraph) -> Rope | None:
    """The graph's rotary embedding, or None (it is not one, or not in a form the template serves)."""
    try:
        return _find(_Graph(g))
    except (KeyError, TypeError, ValueError, IndexError):
        return None


def _find(G: _Graph) -> Rope | None:
    out = next((n for n in G.by.values() if n.op == "output"), None)
    if out is None:
        return None
    res = out.args[0] if isinstance(out.args[0], list) else [out.args[0]]
    found = [_output(G, G.node(r)) for r in res]
    if not found or any(f is None for f in found):
        return None
    # one style, one head, one set of tables: outputs may differ only along dims the tables are broadcast along
    # (Llama's 32 query heads and 8 key-value heads)
    kinds = {(f[0], f[1][-1], len(f[1]), f[2], f[4], f[5]) for f in found}  # type: ignore[index]
    if len(kinds) != 1:
        return None
    style, _, _, rot, cos, sin = next(iter(kinds))
    shapes = tuple(f[1] for f in found)  # type: ignore[index]
    if any(t.strides[d] and s[d] != shapes[0][d] for t in (cos, sin) for s in shapes for d in range(len(t.strides))):
        return None
    abis = [*(f[3] for f in found), cos.abi, sin.abi, *(t.index for t in (cos, sin) if t.index is not None)]
    nodes = {int(n.index): n for n in G.by.values() if n.op in ("input", "param") and n.index is not None}
    tensors = tuple((a, tuple(nodes[a].shape or ()), nodes[a].dtype or "float32") for a in dict.fromkeys(abis))
    return Rope(style, shapes, rot, tuple(f[3] for f in found), cos, sin, tensors,  # type: ignore[index]
                dtype=nodes[found[0][3]].dtype or "float32")  # type: ignore[index]


def _output(G: _Graph, n: CNode | None):
    """(style, shape, rot, x's ABI position, cos, sin) of one output, or None."""
    if n is None or not n.shape:
        return None
    shape = tuple(n.shape)
    body, x_abi = n, None
    if n.op == "cat" and len(n.args[0]) == 2 and G.dim(n, 1) == len(shape) - 1:
        first, rest = G.node(n.args[0][0]), G.slice_of(G.node(n.args[0][1]))
        if first is None or rest is None or rest[3] != 1 or rest[2] != shape[-1] or rest[0].op != "input":
            return None
        body, x_abi = first, int(rest[0].index)
        if rest[1] != body.shape[-1]:
            return None
    if body.op != "add" or tuple(body.shape) != shape[:-1] + (body.shape[-1],):
        return None
    rot = body.shape[-1]
    for a, b in (body.args[:2], body.args[1::-1]):
        m1, m2 = G.node(a), G.node(b)
        got = _terms(G, m1, m2, rot)
        if got is not None:
            style, x, cos_n, sin_n = got
            if x.op != "input":
                if x_abi is None:
                    return None
                sl = G.slice_of(x)
                if sl is None or sl[1] != 0 or sl[2] != rot or sl[3] != 1 or int(sl[0].index) != x_abi:
                    return None
                src = sl[0]
            else:
                src = x
                if x_abi is not None and int(x.index) != x_abi:
                    return None
            if tuple(src.shape or ()) != shape or src.dtype != n.dtype:
                return None
            cos, sin = _table(G, cos_n, shape, rot), _table(G, sin_n, shape, rot)
            if cos is None or sin is None:
                return None
            return style, shape, rot, int(src.index), cos, sin
    return None


def _mul(G: _Graph, n: CNode | None) -> tuple[CNode, CNode] | None:
    if n is None or n.op != "mul" or len(n.args) < 2:
        return None
    a, b = G.node(n.args[0]), G.node(n.args[1])
    return (a, b) if a is not None and b is not None else None


def _terms(G: _Graph, m1: CNode | None, m2: CNode | None, rot: int):
    """(style, x, cos node, sin node) of mul(x, cos) and mul(rot(x), sin), either operand order."""
    p1, p2 = _mul(G, m1), _mul(G, m2)
    if p1 is None or p2 is None:
        return None
    for x, cos in (p1, p1[::-1]):
        for r, sin in (p2, p2[::-1]):
            style = _rotated(G, r, x, rot)
            if style is not None:
                return style, x, cos, sin
    return None


def _rotated(G: _Graph, r: CNode, x: CNode, rot: int) -> str | None:
    """'half' or 'pairs' where r is that rotation of x."""
    if r.op == "cat" and len(r.args[0]) == 2 and G.dim(r, 1) == len(r.shape) - 1 and rot % 2 == 0:
        a, b = G.node(r.args[0][0]), G.node(r.args[0][1])
        h = rot // 2
        if a is not None and a.op == "neg":
            hi, lo = G.slice_of(G.node(a.args[0])), G.slice_of(b)
            if hi and lo and hi[0].name == x.name and lo[0].name == x.name and (hi[1], hi[2], hi[3]) == (h, rot, 1) \
                    and (lo[1], lo[2], lo[3]) == (0, h, 1):
                return "half"
    if r.op == "view" and tuple(r.shape or ()) == tuple(x.shape or ()):
        c = G.node(r.args[0])
        if c is None or c.op != "cat" or len(c.args[0]) != 2 or c.shape[-1] != 2 or G.dim(c, 1) != len(c.shape) - 1:
            return None
        a, b = (G.node(v) for v in c.args[0])
        a, b = _unsq_last(G, a), _unsq_last(G, b)
        if a is None or b is None or a.op != "neg":
            return None
        odd, even = G.slice_of(G.node(a.args[0])), G.slice_of(b)
        if odd and even and odd[0].name == x.name and even[0].name == x.name and (odd[1], odd[3]) == (1, 2) \
                and (even[1], even[3]) == (0, 2) and odd[2] >= rot - 1 and even[2] >= rot - 1:
            return "pairs"
    return None


def _unsq_last(G: _Graph, n: CNode | None) -> CNode | None:
    if n is None or n.op != "unsqueeze" or G.dim(n, 1) != len(n.shape) - 1:
        return None
    return G.node(n.args[0])


def _table(G: _Graph, n: CNode, shape: tuple[int, ...], rot: int) -> Table | None:
    """How cos or sin (a value broadcast against the rotated part, [..., rot]) reads its tensor."""
    interleave = False
    view_shape = tuple(n.shape or ())
    if len(view_shape) > len(shape) or view_shape[-1] != rot:
        return None
    while n.op in PEEL:
        src = G.node(n.args[0])
        if src is None:
            return None
        if n.op == "view" and len(src.shape) >= 2 and src.shape[-1] == 2 and n.shape[-1] == 2 * src.shape[-2]:
            e = src
            while e.op == "identity":
                e = G.node(e.args[0])
            if e is None or e.op != "expand" or G.node(e.args[0]).shape[-1] != 1 or interleave:
                return None
            interleave = True
            n = G.node(e.args[0])
            n = _unsq_last(G, n)
            if n is None:
                return None
            continue
        n = src
    width = rot // 2 if interleave else rot
    col, index, tw = 0, None, 0
    if n.op == "getitem":  # a piece of a split along the last dim
        sp = G.node(n.args[0])
        if sp is None or sp.op != "split":
            return None
        whole, sizes, k = G.node(sp.args[0]), sp.args[1], int(n.args[1])
        nd = len(whole.shape or ()) if whole is not None else 0
        if not nd or len(sp.args) < 3 or (int(sp.args[2]) + nd) % nd != nd - 1:
            return None
        col = k * sizes if isinstance(sizes, int) else sum(sizes[:k])
        n = whole
    if n.op == "index.Tensor":
        tab, idx = G.node(n.args[0]), n.args[1]
        if tab is None or len(idx) != 1 or G.node(idx[0]) is None or len(tab.shape or ()) != 2:
            return None
        ix = G.node(idx[0])
        if ix.op != "input" or ix.dtype != "int64" or tab.op not in ("input", "param"):
            return None
        index, tw = int(ix.index), tab.shape[-1]
        rows_of = tuple(ix.shape or ())
        base = tab
    elif n.op in ("input", "param"):
        base = n
        rows_of = tuple(n.shape[:-1])
        if col + width > n.shape[-1]:
            return None
    else:
        return None
    if index is not None and col + width > tw:
        return None
    # the value's row dims (all but its last, right-aligned to F) that are not 1 are the base's row dims, in order
    vrow = (1,) * (len(shape) - len(view_shape)) + view_shape[:-1]
    live = [d for d, s in enumerate(vrow) if s != 1]
    brow = [s for s in rows_of if s != 1]
    if [vrow[d] for d in live] != brow or any(vrow[d] != shape[d] for d in live):
        return None
    unit = 1 if index is not None else base.shape[-1]
    strides = [0] * (len(shape) - 1)
    s = unit
    for d in reversed(live):
        strides[d] = s
        s *= vrow[d]
    return Table(abi=int(base.index), strides=tuple(strides), col=col, interleave=interleave, index=index, width=tw)
