"""The drop-in's guard (a part of every drop-in): what it checks before the kernel runs, and where it calls the
original forward instead.

The kernel takes a call only when it is what was verified: the backend's device type (all tensors on one device),
the verified dtypes and ranks, strided tensors (non-contiguous ones are copied, as the harness's own inputs were), and
the problem's shape sets: exactly, unless the source is one of fusebot's generated kernels, which read every size from
the call's tensors: their other sizes are accepted too, as far as the source's `// fusebot-sizes:` line says (per ABI
input, each dim a fixed size or a run-time one), or for a kernel without that line (`// fusebot catalog:`, `// fused by
fusebot's seed proposer`) except an input whose element count its set-up checks; never an empty input. An LLM's
kernel may build any size in: only the verified shapes.
Everything else calls the original forward, warning once per reason (FallbackWarning): another device, dtype, rank,
shape or layout, a non-default extra argument, no library for this host, or a kernel error at an unverified size.
Without a warning: FUSEBOT_DISABLE, the class's `fusebot_enabled`, autograd wanting gradients (the kernel is for
inference), jit.trace, fx.symbolic_trace, vmap and other torch.func transforms. A kernel error at a verified shape
raises RuntimeError with the kernel's own message (fusebot_last_error()).
"""

import re
import threading
import warnings

import torch

from runner.dtypes import ABI_DTYPES
from runner.shipped.dropin.head import _HERE, BACKEND, DEVICE_CODE, KERNEL, PROBLEM, TARGET, Original, _ref
from runner.shipped.dropin.runtime import _LIB, _LOCK, log


def _names(module):
    """The forward part's (a later part of the drop-in)."""
    from runner.shipped.dropin.forward import _names as names  # it imports this part: bound at the call
    return names(module)


# ---- the drop-in from here on


class FallbackWarning(UserWarning):
    """The drop-in called the original forward for a call the kernel was not verified for (once per reason)."""


STRICT = False  # the harness's timed drop-in: a call the kernel does not take raises instead (what was timed ran it)
_DTYPES = {getattr(torch, name): code for name, code in ABI_DTYPES.items()}  # fusebot: abi dtypes
_CODES = {v: k for k, v in _DTYPES.items()}
_SEEN = set()
_REFERENCE = threading.local()
_VERIFIED = []  # [(the verified shape sets, or None), why not]
_SIZES = []  # [None: every size fixed, or {ABI input: element count}]


def _note(key, message, warn=True):
    """Say `message` once per `key`: a FallbackWarning, or (an expected path) an INFO log line."""
    if key in _SEEN:
        return
    _SEEN.add(key)
    if warn:
        warnings.warn(f"fusebot drop-in {TARGET}: {message}", FallbackWarning, stacklevel=7)  # the caller's line
    else:
        log.info("fusebot drop-in %s: %s", TARGET, message)


from runner.harness.refs import resolve as _resolve  # noqa: E402  # fusebot: inline


def _evaluate(fn):
    """fn() on the meta device (no memory, no random draws), or for real where meta fails; the RNG left as it was."""
    with torch.random.fork_rng(devices=[]), torch.no_grad():
        try:
            with torch.device("meta"):
                return fn()
        except Exception:  # noqa: BLE001 - a factory that needs real tensors
            return fn()


def _verified():
    """The shape sets the kernel was verified on: [(args, state)], args [("tensor", dtype, shape) | ("number",
    type)], state [(dtype, shape)] in state_dict order, from the problem's own factories (floats in its dtype)."""
    if not _VERIFIED:
        with _LOCK:
            if not _VERIFIED:
                try:
                    dt = getattr(torch, PROBLEM["dtype"]) if PROBLEM["dtype"] else None
                    cast = lambda d: dt if dt is not None and d.is_floating_point else d  # noqa: E731
                    if PROBLEM["input_shapes"]:
                        sets = [[("tensor", dt or torch.float32, tuple(s)) for s in PROBLEM["input_shapes"]]]
                    else:
                        sets = [[("tensor", cast(x.dtype), tuple(x.shape)) if isinstance(x, torch.Tensor)
                                 else ("number", type(x).__name__) for x in _evaluate(_resolve(_ref, ref))]
                                for ref in (PROBLEM["inputs"], PROBLEM["second_inputs"]) if ref]
                    init, ii = list(PROBLEM["init_args"]), PROBLEM["init_inputs"]
                    if not init and ii and (":" in ii or hasattr(_ref, ii)):
                        init = list(_evaluate(_resolve(_ref, ii)))
                    model = _evaluate(lambda: Original(*init, **PROBLEM["init_kwargs"]))
                    state = [(cast(t.dtype), tuple(t.shape)) for t in model.state_dict(keep_vars=True).values()]
                    _VERIFIED[:] = [[(args, state) for args in sets], ""]
                except Exception as exc:  # noqa: BLE001 - user code: say why and use the original
                    _VERIFIED[:] = [None, f"{type(exc).__name__}: {exc}"]
    return _VERIFIED


def _sizes():
    """None when the kernel may have every size built in (only the verified shapes); else the rule per ABI input of
    the sizes it takes, every other size being read from the call's tensors: its source's `// fusebot-sizes:` line
    (per dim a fixed size, or `dK`, a run-time size every dim named dK shares), or for fusebot's other generated
    kernels the element counts their set-up checks."""
    if DEVICE_CODE and _LIB is None:
        return None  # the shipped device code's plans were recorded at the verified calls: only those
    if not _SIZES:
        try:
            text = (_HERE / KERNEL).read_text()
        except OSError:  # the source is not beside it (the harness's timed drop-in): only the verified shapes
            text = ""
        line = re.search(r"^// fusebot-sizes: (.*)$", text, re.M)
        fixed = re.search(r"^// fixed sizes: (.*)$", text, re.M)
        if line:
            rules = {}
            for tok in line.group(1).split():
                key, _, dims = tok.partition("=")
                if key.startswith("in") and key[2:].isdigit():
                    rules[int(key[2:])] = () if dims == "scalar" else tuple(
                        d if d[:1] in ("d", "m") else int(d) for d in dims.split(","))
            _SIZES[:] = [rules]
        elif not re.search(r"^// (fusebot catalog:|fused by fusebot's seed proposer)", text, re.M) or (
                fixed and any(not t.startswith("in") for t in fixed.group(1).split() if t != "none")):
            _SIZES[:] = [None]
        else:
            found = re.findall(r'if \(want != (\d+)LL\) return fb_fail\("input (\d+): size differs', text)
            _SIZES[:] = [{int(pos): int(n) for n, pos in found}]
    return _SIZES[0]


def _size_miss(shape, rule, seen):
    """Why `shape` breaks its ABI input's rule (an element count; or per dim a fixed size, a run-time dim "dK"
    whose size every dim named dK shares in one call, or "mK", dims whose product is dK), or None; `seen` collects
    the run-time dims' sizes."""
    if isinstance(rule, int):
        n = 1
        for s in shape:
            n *= s
        return None if n == rule else f"has {n} elements (the kernel is built for {rule})"
    if len(rule) != len(shape):
        return f"has {len(shape)} dims (the kernel reads {len(rule)})"
    merged = {}
    for j, (s, r) in enumerate(zip(shape, rule)):
        if isinstance(r, int):
            if s != r:
                return f"has size {s} along dim {j} (the kernel is built for {r})"
        elif r.startswith("m"):  # innermost dims the kernel reads as one: their product is its dim
            merged["d" + r[1:]] = merged.get("d" + r[1:], 1) * s
        elif seen.setdefault(r, s) != s:
            return f"has size {s} along dim {j} where another input has {seen[r]} (one dim of the kernel)"
    for r, n in merged.items():
        if seen.setdefault(r, n) != n:
            return f"has {n} elements along its merged dims where another input has {seen[r]} (one dim of the kernel)"
    return None


def _outside(vset, items, sizes):
    """Why the call's arguments and state `items` fall outside the verified set `vset` ((category, text)), or None;
    with `sizes` None only its exact shapes are inside, else what the kernel's size rules take."""
    vargs, vstate = vset
    want = [*vargs, *[("tensor", d, s) for d, s in vstate]]
    if len(items) != len(want):
        return "args", f"{len(items) - len(vstate)} arguments (verified: {len(vargs)})"
    names = [f"input {pos}" + (" (an argument)" if pos < len(vargs) else " (a parameter or buffer)")
             for pos in range(len(items))]
    for pos, (a, v) in enumerate(zip(items, want)):
        if v[0] == "number":
            if type(a).__name__ != v[1]:
                return "args", f"{names[pos]} is a {type(a).__name__} (verified: a Python {v[1]})"
            continue
        if not isinstance(a, torch.Tensor):
            return "args", f"{names[pos]} is a {type(a).__name__} (verified: a tensor)"
        if a.dtype != v[1]:
            return "dtype", f"{names[pos]} is {a.dtype} (verified: {v[1]})"
        if a.dim() != len(v[2]):
            return "rank", f"{names[pos]} has {a.dim()} dims (verified: {len(v[2])})"
    other = [pos for pos, (a, v) in enumerate(zip(items, want)) if v[0] == "tensor" and tuple(a.shape) != v[2]]
    if not other:
        return None
    if sizes is None:
        pos = other[0]
        return "shape", (f"{names[pos]} has shape {tuple(items[pos].shape)} (verified: {want[pos][2]}; the kernel may "
                         "build sizes in)")
    seen = {}
    for pos, a in enumerate(items):
        if isinstance(a, torch.Tensor):
            if a.numel() == 0 and pos in other:
                return "empty", f"{names[pos]} is empty (shape {tuple(a.shape)})"
            miss = _size_miss(tuple(a.shape), sizes[pos], seen) if pos in sizes else None
            if miss:
                return "shape", f"{names[pos]} {miss}"
    return None


def _reference(module, args, state, extra=None):
    """The original forward of `module` with `state` (state_dict order), and `extra` (name -> tensor), in place of
    its own tensors."""
    _REFERENCE.on = getattr(_REFERENCE, "on", 0) + 1
    try:
        return torch.func.functional_call(module, {**dict(zip(_names(module), state)), **(extra or {})}, tuple(args))
    finally:
        _REFERENCE.on -= 1


def _meta_buffers(module):
    """The buffers the state_dict leaves out (registered with persistent=False, as a causal mask often is), on the
    meta device: with them real, the meta run fails on mixed devices and the original runs for real instead."""
    names = set(_names(module))
    return {n: b.to("meta") for n, b in module.named_buffers() if n not in names}


def _plan(module, items, n_state):
    """("kernel", output specs, single, exact) for a call of these arguments and state, or ("original", category,
    text). Output specs: (shape, dtype, strides) of the original's outputs, from a run on meta tensors."""
    table, why = _verified()
    if table is None:
        return "original", "verified", f"the shapes it was verified on cannot be recomputed here ({why})"
    tensors = [t for t in items if isinstance(t, torch.Tensor)]
    if any(t.layout != torch.strided for t in tensors):
        return "original", "layout", f"a {next(t.layout for t in tensors if t.layout != torch.strided)} tensor"
    devices = {t.device for t in tensors}
    if len(devices) > 1 or any(d.type != BACKEND for d in devices):
        return "original", "device", (f"tensors on {', '.join(sorted(map(str, devices)))} (the kernel runs on one "
                                      f"{BACKEND} device)")
    sizes = _sizes()
    reasons = [_outside(v, items, sizes) for v in table]
    if all(reasons):
        return ("original", *reasons[0])
    exact = any(r is None and _outside(v, items, None) is None for r, v in zip(reasons, table))
    args, state = items[:len(items) - n_state], items[len(items) - n_state:]
    with torch.no_grad():
        try:
            out = _reference(module, [a.to("meta") if isinstance(a, torch.Tensor) else a for a in args],
                             [t.to("meta") for t in state], _meta_buffers(module))
        except Exception:  # noqa: BLE001 - an op without a meta kernel: run it once for real
            out = _reference(module, args, state)
    outs = [out] if isinstance(out, torch.Tensor) else list(out) if isinstance(out, (tuple, list)) else None
    if outs is None or not all(isinstance(o, torch.Tensor) and o.dtype in _DTYPES for o in outs):
        return "original", "output", "the original returns something other than tensors or a tuple of them"
    return "kernel", [(tuple(o.shape), o.dtype, tuple(o.stride())) for o in outs], isinstance(out, torch.Tensor), exact


