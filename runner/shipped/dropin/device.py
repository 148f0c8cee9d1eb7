"""The drop-in's device-code path (a part of every drop-in, after the guard): the shipped cubin of this GPU's arch,
else the shipped PTX of an arch up to its own (compiled by the driver), its sha256 checked against the one recorded
in the drop-in, loaded through the CUDA driver API (libcuda.so.1 via ctypes: cuModuleLoadData, cuModuleGetFunction)
into the device's primary context, and each verified call's launch plan (runner/harness/launch_plan.py) replayed on
torch's current stream (cuLaunchKernel, cuLaunchKernelEx for a cooperative or clustered launch, cuMemsetD8Async), its
tensors' addresses written into the parameter bytes' slots. No host code of the kernel runs; a call without a plan
is a KernelError (the guard's fallback), a host where the device code does not run or the driver cannot be used a
BuildError (the original forward, one warning).

Names it defines that other code relies on: `_run_plan(inputs, outs, device)` (the kernel path's `_run`, call.py).
"""

import base64
import ctypes
import hashlib
import re
import struct

import torch

from runner.shipped.dropin.call import KernelError
from runner.shipped.dropin.guard import _DTYPES
from runner.shipped.dropin.head import _HERE, DEVICE_CODE, PLANS
from runner.shipped.dropin.runtime import _LOCK, BuildError, _host_arch, _rank

# ---- the drop-in from here on


class _Driver:
    """The CUDA driver (libcuda.so.1) through ctypes: the shipped cubin (or PTX) loaded per device, its kernels
    launched from their plans on torch's current stream. Nothing else native runs."""

    def __init__(self):
        self.lib = ctypes.CDLL("libcuda.so.1")
        self._check(self.lib.cuInit(0), "cuInit")
        self.modules = {}  # device index -> (module, {kernel name: function}, arch of the image)

    def _check(self, rc, what):
        if rc != 0:
            name = ctypes.c_char_p()
            self.lib.cuGetErrorName(rc, ctypes.byref(name))
            raise KernelError(f"{what}: {(name.value or b'CUDA error').decode()} ({rc})")

    def context(self, index):
        ctx, cur = self.modules.get(("ctx", index)), ctypes.c_void_p()
        if ctx is None:
            dev, ctx = ctypes.c_int(), ctypes.c_void_p()
            self._check(self.lib.cuDeviceGet(ctypes.byref(dev), index), "cuDeviceGet")
            self._check(self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), dev), "cuDevicePrimaryCtxRetain")
            self.modules[("ctx", index)] = ctx
        self.lib.cuCtxGetCurrent(ctypes.byref(cur))
        if cur.value != ctx.value:
            self._check(self.lib.cuCtxSetCurrent(ctx), "cuCtxSetCurrent")

    def module(self, index, image, arch):
        got = self.modules.get(index)
        if got is None:
            self.context(index)
            mod = ctypes.c_void_p()
            self._check(self.lib.cuModuleLoadData(ctypes.byref(mod), ctypes.c_char_p(image)), f"loading the {arch} code")
            got = self.modules[index] = (mod, {}, arch)
        return got

    def function(self, index, name):
        mod, fns, _ = self.modules[index]
        fn = fns.get(name)
        if fn is None:
            fn = ctypes.c_void_p()
            self._check(self.lib.cuModuleGetFunction(ctypes.byref(fn), mod, name.encode()), f"kernel {name}")
            fns[name] = fn
        return fn


class _LaunchConfig(ctypes.Structure):
    _fields_ = [("grid", ctypes.c_uint * 3), ("block", ctypes.c_uint * 3), ("shmem", ctypes.c_uint),
                ("stream", ctypes.c_void_p), ("attrs", ctypes.c_void_p), ("n_attrs", ctypes.c_uint)]


class _LaunchAttr(ctypes.Structure):
    _fields_ = [("id", ctypes.c_int), ("pad", ctypes.c_char * 4), ("value", ctypes.c_uint * 16)]


_DRIVER = []
_PARAMS_END, _PARAMS_POINTER, _PARAMS_SIZE = 0, 1, 2  # CU_LAUNCH_PARAM_END, _BUFFER_POINTER, _BUFFER_SIZE
_ATTR_COOPERATIVE, _ATTR_CLUSTER = 2, 4  # CU_LAUNCH_ATTRIBUTE_COOPERATIVE, _CLUSTER_DIMENSION
_ADDR64 = struct.Struct("<Q")  # an address in a kernel's parameter bytes


def _device_image(device):
    """(image bytes, its arch) of the shipped device code that runs on `device`: the cubin of its own arch, else the
    PTX of an arch up to its own (the driver compiles it); BuildError when none runs there or its sha256 differs."""
    host = _host_arch(device)
    if host in DEVICE_CODE:
        arch = host
    else:
        ptx = sorted((a for a in DEVICE_CODE if a.startswith("compute_") and int(a[8:]) <= (_rank(host) or 0)),
                     key=lambda a: int(a[8:]), reverse=True)
        if not ptx:
            raise BuildError(f"the shipped device code ({', '.join(sorted(DEVICE_CODE))}) does not run on this GPU "
                             f"({host})")
        arch = ptx[0]
    name, digest = DEVICE_CODE[arch]
    try:
        text = (_HERE / name).read_text()
    except OSError as exc:
        raise BuildError(f"the shipped device code {name} cannot be read ({exc})") from None
    if name.endswith(".ptx"):  # the licence line a PR's files carry is not the compiler's
        text = re.sub(r"\A// SPDX-License-Identifier:[^\n]*\n", "", text)
    data = text.encode() + b"\0" if name.endswith(".ptx") else base64.b64decode(
        "".join(ln for ln in text.splitlines() if not ln.startswith("#")))
    if hashlib.sha256(data.rstrip(b"\0") if name.endswith(".ptx") else data).hexdigest() != digest:
        raise BuildError(f"the shipped device code {name} does not have the sha256 recorded in this drop-in (altered "
                         "or replaced); it is not loaded")
    return data, arch


def _driver_module(device):
    index = device.index if device.index is not None else torch.cuda.current_device()
    if not _DRIVER:
        with _LOCK:
            if not _DRIVER:
                try:
                    _DRIVER.append(_Driver())
                except (OSError, KernelError) as exc:
                    _DRIVER.append(BuildError(f"the CUDA driver cannot be used here ({exc})"))
    drv = _DRIVER[0]
    if isinstance(drv, BuildError):
        raise drv
    if index not in drv.modules:
        with _LOCK:
            if index not in drv.modules:
                image, arch = _device_image(device)
                drv.module(index, image, arch)
    return drv, index


def _plan_key(tensors):
    return tuple((_DTYPES[t.dtype], tuple(t.shape)) for t in tensors)


_PLANS = {}  # (input key, output key) -> plan, built once from PLANS


def _find_plan(inputs, outs):
    if not _PLANS and PLANS:
        for p in PLANS:
            key = (tuple((_DTYPES[getattr(torch, d)], tuple(s)) for d, s in p["inputs"]),
                   tuple((_DTYPES[getattr(torch, d)], tuple(s)) for d, s in p["outputs"]))
            _PLANS[key] = p
    return _PLANS.get((_plan_key(inputs), _plan_key(outs)))


def _steps(plan):
    """A plan's steps made ready once: each launch's grid, block and shared memory as ctypes values and its parameter
    bytes, into which a call writes its tensors' addresses."""
    ready = _READY.get(id(plan))
    if ready is None or ready[0] is not plan:
        steps = []
        for step in plan["steps"]:
            if step["op"] != "launch":
                steps.append((step["op"], step))
                continue
            raw = bytes.fromhex(step["params"])
            size = ctypes.c_size_t(len(raw))
            dims = tuple(ctypes.c_uint(v) for v in (*step["grid"], *step["block"]))
            special = bool(step["cooperative"] or step["cluster"] != [1, 1, 1])
            steps.append(("launch", step, raw, [tuple(s) for s in step["slots"]], size,
                          ctypes.addressof(size), dims, ctypes.c_uint(step["shmem"]), special))
        ready = _READY[id(plan)] = (plan, steps)
    return ready[1]


_READY = {}  # id(plan) -> (plan, its steps made ready)


def _run_plan(inputs, outs, device, stream=None, plan=None):
    """The kernel's recorded steps for this call (`plan`, else the one found for its shapes), launched through the
    driver on `stream` (torch's current stream by default); KernelError when no plan was recorded for these shapes
    (the host code ran only at the verified calls)."""
    plan = plan or _find_plan(inputs, outs)
    if plan is None:
        raise KernelError("no launch plan for these shapes (the shipped device code runs at the verified sizes)")
    drv, index = _driver_module(device)
    inputs = [t if t.data_ptr() % 256 == 0 else t.clone() for t in inputs]  # aligned as the recording's were
    ws = torch.empty(plan["workspace"], dtype=torch.uint8, device=device) if plan["workspace"] else None
    ptrs = [t.data_ptr() for t in (*inputs, *outs)]
    ptrs.append(ws.data_ptr() if ws is not None else None)  # slot -1: the workspace
    stream = ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream if stream is None else stream)
    drv.context(index)
    for op, step, *ready in _steps(plan):
        if op == "attribute":
            drv._check(drv.lib.cuFuncSetAttribute(drv.function(index, step["kernel"]), step["attribute"],
                                                  step["value"]), "cuFuncSetAttribute")
        elif op == "memset":
            k, delta = step["slot"]
            drv._check(drv.lib.cuMemsetD8Async(ctypes.c_uint64(ptrs[k] + delta), ctypes.c_ubyte(step["value"] & 0xFF),
                                               ctypes.c_size_t(step["bytes"]), stream), "cuMemsetD8Async")
        else:
            params, slots, size, size_addr, dims, shmem, special = ready
            raw = bytearray(params)
            for off, k, delta in slots:
                _ADDR64.pack_into(raw, off, ptrs[k] + delta)
            buf = (ctypes.c_char * max(len(raw), 1)).from_buffer(raw) if raw else None
            extra = (ctypes.c_void_p * 5)(_PARAMS_POINTER, ctypes.addressof(buf) if buf is not None else None,
                                          _PARAMS_SIZE, size_addr, _PARAMS_END)
            fn = drv.function(index, step["kernel"])
            if special:
                g, b = step["grid"], step["block"]
                attrs = (_LaunchAttr * 2)()
                n = 0
                if step["cooperative"]:
                    attrs[n].id, attrs[n].value[0], n = _ATTR_COOPERATIVE, 1, n + 1
                if step["cluster"] != [1, 1, 1]:
                    attrs[n].id = _ATTR_CLUSTER
                    attrs[n].value[0], attrs[n].value[1], attrs[n].value[2] = step["cluster"]
                    n += 1
                cfg = _LaunchConfig((ctypes.c_uint * 3)(*g), (ctypes.c_uint * 3)(*b), step["shmem"], stream,
                                    ctypes.cast(attrs, ctypes.c_void_p), n)
                rc = drv.lib.cuLaunchKernelEx(ctypes.byref(cfg), fn, None, extra)
            else:
                rc = drv.lib.cuLaunchKernel(fn, *dims, shmem, stream, None, extra)
            drv._check(rc, f"launching {step['kernel']}")
    return 0
