"""Which sizes a generated kernel takes at run time and which it is specialised on.

A plain input (its own contiguous tensor, broadcast against the others) is read with the sizes of the call's tensor.
A viewed input (a reshape, an unsqueeze, a slice, a permute of a tensor) is read through the view captured at the
traced sizes; a leading run of the view's dims still follows the call's tensor where the view provably does the same
for any size along them (`free_dims`):

- a contiguous view (strides None): walking the view's dims of size != 1 and the tensor's dims of size != 1 from the
  outermost, view dim d and tensor dim j match while their sizes are equal and the elements after them are as many
  (prod(view[d+1:]) == prod(tensor[j+1:])): such a dim indexes the tensor the same way whatever its size;
- a strided view (a slice or piece of a tensor, Input.strides): view dim d and tensor dim j match while their sizes
  are equal, d's stride is the tensor's stride along j and d is not shifted; what is left of the view (its offset
  and the reach of its other dims) must stay inside one step of the last matched dim;
- a reshaped strided view (Input.terms): the same, where view dim d is read by one term (c // 1) % size times the
  tensor's stride along j (GPT-J's interleaved pairs: batch, sequence and heads follow, the head dim is fixed).

An F dim is free when some input's tensor follows it and every input that spans it (size != 1 in its view) does;
a layout may fix more (`regs`, `cluster` and `grid` hold a row of the captured length: the reduced dims; `rope` every
dim).

`sizes_line` writes the result as the generated source's machine-readable line, per ABI input position:

    // fusebot-sizes: in0=d0,d1,64 in1=64

A number is a size the kernel is specialised on (a call with another is refused by the kernel's set-up); `dK` is a
run-time size, F's dim K: every tensor dim named dK must have the same size in one call (they are the same dim of
the iteration space), and any size >= 1 is served. `mK` marks a tensor's innermost dims that a contiguous view
merges into F's dim K (`merged_dims`): their product is that dim's size. The tensor's number of dims is the number of
entries.
"""

from __future__ import annotations

from math import prod

from runner.catalog.ir import Input, Program

ROW_ON_CHIP = ("regs", "cluster", "grid")  # layouts specialised on the row length R
ALL_FIXED = ("rope",)  # layouts specialised on every size (runner.catalog.codegen.cuda.rope)


def tensor_shape(inp: Input) -> tuple[int, ...]:
    """The captured shape of the ABI tensor an input reads (a plain input's own shape)."""
    return tuple(inp.tensor) if inp.tensor is not None else tuple(inp.shape)


def free_dims(p: Program, k: int) -> dict[int, int]:
    """Input k's F dims that follow its tensor at run time: F dim -> tensor dim (see the module docstring)."""
    inp = p.inputs[k]
    nd = p.ndim
    S = tensor_shape(inp)
    pad = nd - len(inp.shape)
    V = p.padded(k)
    if not inp.viewed:
        tpad = nd - len(S)
        return {j + tpad: j for j in range(len(S))}
    if inp.tensor is None:
        return {}
    if inp.strides is not None:
        st = (0,) * pad + tuple(inp.strides)
        sh = (0,) * pad + tuple(inp.shift or (0,) * len(inp.shape))
    if inp.terms is not None:
        return _free_terms(inp, V, S, pad, sh)
    out: dict[int, int] = {}
    j = 0
    for d in range(nd):
        if V[d] == 1:
            continue
        while j < len(S) and S[j] == 1:
            j += 1
        if j >= len(S) or V[d] != S[j]:
            break
        if inp.strides is None:
            if prod(V[d + 1:]) != prod(S[j + 1:]):
                break
        elif st[d] != prod(S[j + 1:]) or sh[d] != 0:
            break
        out[d] = j
        j += 1
    if inp.strides is not None and out:
        rest = [d for d in range(nd) if V[d] != 1 and d not in out]
        reach = inp.offset + sum((V[d] - 1) * st[d] for d in rest)
        if any(st[d] < 0 for d in rest) or any(d < max(out) for d in rest) or reach >= prod(S[j:]):
            return {}
    return out


def _free_terms(inp: Input, V: tuple[int, ...], S: tuple[int, ...], pad: int, sh: tuple[int, ...]) -> dict[int, int]:
    """A reshaped strided view's leading dims that follow its tensor: view dim d and tensor dim j match while d is
    read by one term, (c // 1) % S[j] times the tensor's stride along j, and is not shifted; the other terms (and
    the offset) must reach inside one step of the last matched dim."""
    terms = inp.terms or ()
    out: dict[int, int] = {}
    j = 0
    for d in range(len(V)):
        if V[d] == 1:
            continue
        while j < len(S) and S[j] == 1:
            j += 1
        on_d = [t for t in terms if t[0] + pad == d]
        if j >= len(S) or V[d] != S[j] or sh[d] != 0 or on_d != [(d - pad, 1, S[j], prod(S[j + 1:]))]:
            break
        out[d] = j
        j += 1
    rest = [t for t in terms if t[0] + pad not in out]
    if any(t[0] + pad < max(out, default=-1) for t in rest) or any(t[3] < 0 for t in rest) \
            or inp.offset + sum((t[2] - 1) * t[3] for t in rest) >= prod(S[j:]):
        return {}
    return out


def merged_dims(p: Program, k: int) -> dict[int, tuple[int, ...]]:
    """Input k's innermost view dim, when it is its tensor's innermost dims merged by a contiguous view and
    `free_dims` does not already follow it: F dim -> those tensor dims, whose product it is at run time. GroupNorm
    reads [N, C, H, W] as [N, G, C/G, H*W]: the batch follows the tensor's dim 0, H*W the product of dims 2 and 3."""
    inp = p.inputs[k]
    if not inp.viewed or inp.tensor is None or inp.strides is not None or inp.terms is not None:
        return {}
    V, S = p.padded(k), tensor_shape(inp)
    spanned = [d for d in range(p.ndim) if V[d] != 1]
    lead = free_dims(p, k)
    if not spanned or spanned[-1] in lead:
        return {}
    d = spanned[-1]
    for j in range(max(lead.values(), default=-1) + 1, len(S)):
        if S[j] != 1 and prod(S[j:]) == V[d]:
            return {d: tuple(range(j, len(S)))}
    return {}


def free_f_dims(p: Program, layout: str = "") -> set[int]:
    """F's dims whose size is read from the call's tensors (see the module docstring)."""
    maps = [{**free_dims(p, k), **merged_dims(p, k)} for k in range(len(p.inputs))]
    out = set()
    for d in range(p.ndim):
        spans = [k for k in range(len(p.inputs)) if p.padded(k)[d] != 1 or d in maps[k]]
        if spans and all(d in maps[k] for k in spans):
            out.add(d)
    if layout in ALL_FIXED:
        return set()
    if layout in ROW_ON_CHIP and p.axes:
        out -= set(range(p.axes[0], p.axes[-1] + 1))
    return out


def abi_sizes(p: Program, abi_offset: int = 0, layout: str = "") -> dict[int, list[str]]:
    """ABI input position -> each dim of its tensor: 'dK' (F's dim K, read at run time) or the fixed size."""
    free = free_f_dims(p, layout)
    out: dict[int, list[str]] = {}
    for k, inp in enumerate(p.inputs):
        S = tensor_shape(inp)
        by_tensor = {j: f"d{d}" for d, j in free_dims(p, k).items() if d in free}
        if not inp.viewed:  # a plain input's dim of size 1 broadcast along a larger F dim stays 1
            by_tensor = {j: t for j, t in by_tensor.items() if S[j] == p.shape[int(t[1:])]}
        for d, js in merged_dims(p, k).items():
            if d in free:
                by_tensor.update({j: f"{'d' if len(js) == 1 else 'm'}{d}" for j in js})
        dims = [by_tensor.get(j, str(S[j])) for j in range(len(S))]
        pos = inp.abi + abi_offset
        if pos in out:  # read twice (a slice and the whole): a dim is free only where both reads follow it alike
            dims = [a if a == b else str(S[j]) for j, (a, b) in enumerate(zip(out[pos], dims, strict=True))]
        out[pos] = dims
    return dict(sorted(out.items()))


def sizes_line(p: Program, abi_offset: int = 0, layout: str = "") -> str:
    """The source's `// fusebot-sizes:` line."""
    body = " ".join(f"in{pos}={','.join(dims) or 'scalar'}" for pos, dims in abi_sizes(p, abi_offset, layout).items())
    return f"// fusebot-sizes: {body or 'none'}"
