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

import ctypes
import itertools
import re
import struct
import threading
import warnings

import torch

from runner.dtypes import ABI_DTYPES
from runner.shipped.dropin.head import _HERE, BACKEND, DEVICE_CODE, KERNEL, OP_NAME, PROBLEM, TARGET, Original, _ref
from runner.shipped.dropin.runtime import _LIB, _LOCK, _FbTensor, _library, log


def _names(module):
    """The forward part's (a later part of the drop-in)."""
    from runner.shipped.dropin.forward import _names as names  # it imports this part: bound at the call
    return names(module)


def _run_plan(inputs, outs, device, stream=None, plan=None):
    """The device part's (a later part of the drop-in)."""
    from runner.shipped.dropin.device import _run_plan as run_plan  # it imports this part: bound at the call
    return run_plan(inputs, outs, device, stream, plan)


def _find_plan(inputs, outs):
    """The device part's (a later part of the drop-in)."""
    from runner.shipped.dropin.device import _find_plan as find_plan  # it imports this part: bound at the call
    return find_plan(inputs, outs)


def _count():
    """The class's (the last part of the drop-in)."""
    from runner.shipped.dropin.subclass import _count as count  # it imports this part: bound at the call
    count()

# ---- the drop-in from here on


class FallbackWarning(UserWarning):
    """The drop-in called the original forward for a call the kernel was not verified for (once per reason)."""


STRICT = False  # the harness's timed drop-in: a call the kernel does not take raises instead (what was timed ran it)
_DTYPES = {getattr(torch, name): code for name, code in ABI_DTYPES.items()}  # fusebot: abi dtypes
_CODES = {v: k for k, v in _DTYPES.items()}
_PACK = struct.Struct("<qii8q8q")  # _FbTensor's bytes: one pack per tensor, not a ctypes field write per number
_ADDR = struct.Struct("<q")  # its data address, the first field
_SEEN = set()
_REFERENCE = threading.local()
_WS_NEED = {}  # (device, input shapes) -> the workspace bytes the kernel asked for
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


def _describe_all(tensors):
    """The fb_tensor array for `tensors` (at least one element: the ABI's arrays are never empty)."""
    return _filled(_template([(t.dtype, tuple(t.shape), tuple(t.stride())) for t in tensors]), tensors)


def _template(layouts):
    """(array type, bytes) of the fb_tensor array for tensors of these (dtype, shape, strides), every data address 0:
    made once per call signature, a call writing in its tensors' addresses alone (_filled)."""
    parts = []
    for dtype, shape, stride in layouts:
        pad = (0,) * (8 - len(shape))
        parts.append(_PACK.pack(0, _DTYPES[dtype], len(shape), *shape, *pad, *stride, *pad))
    return _FbTensor * max(len(parts), 1), b"".join(parts) or bytes(_PACK.size)


def _filled(template, tensors):
    """A fresh fb_tensor array from `template` with the data addresses of `tensors` written in (one per call: calls
    on several threads share no array)."""
    kind, data = template
    buf = bytearray(data)
    for k, t in enumerate(tensors):
        _ADDR.pack_into(buf, k * _PACK.size, t.data_ptr())
    return kind.from_buffer(buf)


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


def _dense(shape, stride):
    """Whether `stride` lays `shape` out densely in some order (a transpose, channels-last): one that empty_strided
    can allocate and copy_ can fill."""
    dims = sorted((s, n) for s, n in zip(stride, shape) if n != 1)
    expect = 1
    for s, n in dims:
        if s != expect:
            return False
        expect *= n
    return True


def _launch(lib, inputs, outs, stream, device, call=None):
    """fusebot_forward, with scratch memory from torch's caching allocator (per device and stream) where the
    library takes it (fusebot_set_workspace), retried once with what it asked for; `call` (_Call) holds the
    tensor arrays' templates of this call signature."""
    if call is None:
        ins, outd = _describe_all(inputs), _describe_all(outs)
        key = None
    else:
        ins, outd, key = *call.arrays(inputs, outs), call.ws_key
    if lib.fb_set_workspace is None or lib.fb_workspace_need is None:
        return lib.fusebot_forward(ins, len(inputs), outd, len(outs), stream)
    key = key or (device, *(tuple(t.shape) for t in inputs))
    need = _WS_NEED.get(key, 0)
    for _ in range(2):
        ws = torch.empty(need, dtype=torch.uint8, device=device) if need else None
        lib.fb_set_workspace(ws.data_ptr() if ws is not None else None, need)
        rc = lib.fusebot_forward(ins, len(inputs), outd, len(outs), stream)
        asked = lib.fb_workspace_need()
        if asked <= need:
            return rc
        if len(_WS_NEED) > 1024:
            _WS_NEED.clear()
        _WS_NEED[key] = need = asked
        if rc == 0:
            return 0  # a path without scratch memory: the next call gets it
    return rc


class KernelError(RuntimeError):
    """The kernel refused or failed a call; the message is its own (fusebot_last_error())."""


class _Call:
    """The kernel path of one call signature (inputs' dtypes, shapes, strides, device; the outputs' specs), made once:
    its device, library or launch plan, the outputs to allocate and those to lay out as the original's, and the
    fb_tensor arrays with every field but the data addresses filled in. A call of that signature then does no more
    than allocate its outputs, write in its tensors' addresses and launch."""

    __slots__ = ("device", "index", "planned", "lib", "plan", "alloc", "restride", "ins", "outs", "ws_key", "local")

    def __init__(self, inputs, specs):
        device = self.device = inputs[0].device if inputs else torch.device(BACKEND)
        self.planned = bool(DEVICE_CODE) and _LIB is None and device.type == "cuda"  # the shipped cubin, no host code
        self.lib = None if self.planned else _library(device)
        self.index = None
        if device.type == "cuda":
            self.index = device.index if device.index is not None else torch.cuda.current_device()
        self.alloc = [(shape, dtype) for shape, dtype, _ in specs]
        dense = [(dtype, shape, _contiguous(shape)) for shape, dtype, _ in specs]  # as torch.empty lays them out
        self.restride = [(j, shape, dtype, stride) for j, ((shape, dtype, stride), (_, _, own))
                         in enumerate(zip(specs, dense)) if stride != own and _numel(shape) > 1 and _dense(shape, stride)]
        self.ins = _template([(t.dtype, tuple(t.shape), tuple(t.stride())) for t in inputs])
        self.outs = _template(dense)
        self.ws_key = (device, *(tuple(t.shape) for t in inputs))
        self.local = threading.local()
        self.plan = None
        if self.planned:
            self.plan = _find_plan(inputs, [torch.empty(shape, dtype=dtype, device="meta") for dtype, shape, _ in dense])


    def arrays(self, inputs, outs):
        """The fb_tensor arrays of this call: this thread's own pair, made from the templates at its first call,
        with the tensors' data addresses written in."""
        pair = getattr(self.local, "pair", None)
        if pair is None:
            pair = self.local.pair = (self.ins[0].from_buffer_copy(self.ins[1]),
                                      self.outs[0].from_buffer_copy(self.outs[1]))
        ins, outd = pair
        for k, t in enumerate(inputs):
            _ADDR.pack_into(ins, k * _PACK.size, t.data_ptr())
        for k, t in enumerate(outs):
            _ADDR.pack_into(outd, k * _PACK.size, t.data_ptr())
        return pair


def _numel(shape):
    n = 1
    for s in shape:
        n *= s
    return n


def _contiguous(shape):
    """The strides torch.empty gives `shape`."""
    strides, step = [], 1
    for n in reversed(shape):
        strides.append(step)
        step *= max(n, 1)
    return tuple(reversed(strides))


def _run(inputs, specs, call=None):
    """The kernel on `inputs` (contiguous: the forward's arguments, then the state): outputs laid out as the
    original's (`specs`); `call`, the _Call of this signature where the caller keeps one."""
    call = call or _Call(inputs, specs)
    device = call.device
    outs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in call.alloc]
    lib = call.lib
    if call.index is not None:
        index = call.index
        prev = torch.cuda.current_device()
        if prev != index:
            torch.cuda.set_device(index)
        try:
            stream = torch._C._cuda_getCurrentRawStream(index)
            rc = _run_plan(inputs, outs, device, stream, call.plan) if call.planned else _launch(
                lib, inputs, outs, ctypes.c_void_p(stream), device, call)
        finally:
            if prev != index:
                torch.cuda.set_device(prev)
    else:
        rc = _launch(lib, inputs, outs, None, device, call)
    if rc != 0:
        text = lib.fb_last_error().decode(errors="replace") if lib.fb_last_error is not None else ""
        raise KernelError(f"fusebot_forward returned {rc}" + (f": {text}" if text else ""))
    _count()
    for j, shape, dtype, stride in call.restride:
        outs[j] = torch.empty_strided(shape, stride, dtype=dtype, device=device).copy_(outs[j])
    return outs


def _specs(meta):
    """[(shape, dtype, strides)] from the op's flat int list: per output its dtype code, ndim, shape, strides."""
    specs, i = [], 0
    while i < len(meta):
        code, nd = meta[i], meta[i + 1]
        specs.append((tuple(meta[i + 2:i + 2 + nd]), _CODES[code], tuple(meta[i + 2 + nd:i + 2 + 2 * nd])))
        i += 2 + 2 * nd
    return specs


def _free_op_name(name):
    """OP_NAME, or OP_NAME_<n> when this file is loaded a second time under another module name."""
    ns, base = name.split("::")
    for n in itertools.count():
        candidate = base if n == 0 else f"{base}_{n}"
        try:
            getattr(getattr(torch.ops, ns), candidate)
        except (AttributeError, RuntimeError):
            return f"{ns}::{candidate}"


@torch.library.custom_op(_free_op_name(OP_NAME), mutates_args=())
def fused(args: list[torch.Tensor], state: list[torch.Tensor], meta: list[int]) -> list[torch.Tensor]:
    """The kernel as a custom op (what torch.compile sees); `meta` lays out the outputs (_specs)."""
    return _run([t.contiguous() for t in [*args, *state]], _specs(meta))


@fused.register_fake
def _fused_fake(args, state, meta):
    device = (args or state)[0].device
    return [torch.empty_strided(shape, stride, dtype=dtype, device=device) for shape, dtype, stride in _specs(meta)]
