"""The drop-in's kernel path (a part of every drop-in, after the guard): a call signature's path made once (`_Call`:
the library or the launch plan, the outputs to allocate and lay out as the original's, the ABI arrays with every field
but the data addresses filled in), the kernel run on a call (`_run`: CPU or host code through `fusebot_forward`, with
scratch memory from torch's caching allocator; shipped device code through the device part's launch plan), and the
custom op torch.compile sees (`fused`).
"""

import ctypes
import itertools
import struct
import threading

import torch

from runner.shipped.dropin.guard import _CODES, _DTYPES
from runner.shipped.dropin.head import BACKEND, DEVICE_CODE, OP_NAME
from runner.shipped.dropin.runtime import _LIB, _FbTensor, _library


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


_PACK = struct.Struct("<qii8q8q")  # _FbTensor's bytes: one pack per tensor, not a ctypes field write per number
_ADDR = struct.Struct("<q")  # its data address, the first field
_WS_NEED = {}  # (device, input shapes) -> the workspace bytes the kernel asked for


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
