"""Handing a CUDA output from the candidate's process to the judge's without a host copy (CUDA IPC, driver API).

The candidate's process keeps the output tensor alive and sends the allocation's IPC handle, the tensor's offset in
it, its byte count; the judge maps the allocation, copies the bytes into its own memory and unmaps it before it
compares anything. A 6.4 GB output took 4.3 s to write through /dev/shm and as long to read back on the H100; through
IPC it is one device-to-device copy. Where IPC is unavailable (no driver library, a VMM allocation, processes
in separate PID namespaces as under bubblewrap) the caller falls back to the file path: `export` raises IpcUnavailable
with the reason.
"""

from __future__ import annotations

import ctypes
import functools
import os

import torch


class IpcUnavailable(RuntimeError):
    """CUDA IPC cannot carry this tensor here; the caller writes it to a file instead."""


class _Handle(ctypes.Structure):
    _fields_ = [("reserved", ctypes.c_uint8 * 64)]  # CUipcMemHandle (bytes: a c_char field would stop at a NUL)


@functools.cache
def _driver() -> ctypes.CDLL:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError as exc:
        raise IpcUnavailable(f"no CUDA driver library: {exc}") from exc
    lib.cuMemGetAddressRange_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), ctypes.POINTER(ctypes.c_size_t),
                                            ctypes.c_uint64]
    lib.cuIpcGetMemHandle.argtypes = [ctypes.POINTER(_Handle), ctypes.c_uint64]
    lib.cuIpcOpenMemHandle_v2.argtypes = [ctypes.POINTER(ctypes.c_uint64), _Handle, ctypes.c_uint]
    lib.cuIpcCloseMemHandle.argtypes = [ctypes.c_uint64]
    return lib


def preload() -> None:
    _driver()


def _check(code: int, what: str) -> None:
    if code != 0:
        raise IpcUnavailable(f"{what} failed with CUresult {code}")


def export(t: torch.Tensor) -> dict:
    """The IPC record of a contiguous CUDA tensor's bytes. The caller keeps `t` alive until the judge has read it."""
    if not (t.is_cuda and t.is_contiguous()):
        raise IpcUnavailable("only contiguous CUDA tensors")
    if os.environ.get("FUSEBOT_SANDBOX") == "bwrap":  # set by runner.harness.bwrap
        # legacy CUDA IPC handles are opened by PID, and the judge is in another PID namespace
        raise IpcUnavailable("each process has its own PID namespace (bubblewrap): CUDA IPC cannot reach the judge")
    lib = _driver()
    torch.cuda.synchronize(t.device)
    ptr = t.data_ptr()
    base, size = ctypes.c_uint64(), ctypes.c_size_t()
    _check(lib.cuMemGetAddressRange_v2(ctypes.byref(base), ctypes.byref(size), ctypes.c_uint64(ptr)),
           "cuMemGetAddressRange")
    handle = _Handle()
    _check(lib.cuIpcGetMemHandle(ctypes.byref(handle), base), "cuIpcGetMemHandle")
    return {"handle": bytes(handle.reserved).hex(), "offset": ptr - base.value,
            "nbytes": t.numel() * t.element_size(), "device": t.device.index or 0}


class _Cai:
    """A bare __cuda_array_interface__ so that torch can view mapped bytes without copying them."""

    def __init__(self, ptr: int, nbytes: int):
        self.__cuda_array_interface__ = {"data": (ptr, False), "shape": (nbytes,), "typestr": "|u1", "version": 3}


def receive(record: dict, device: str) -> torch.Tensor:
    """A copy, in this process's memory, of the bytes `record` names (uint8, flat)."""
    lib = _driver()
    torch.cuda.synchronize(device)  # the primary context is current on this thread for the driver calls below
    nbytes, offset = int(record["nbytes"]), int(record["offset"])
    if nbytes == 0:
        return torch.empty(0, dtype=torch.uint8, device=device)
    handle = _Handle()
    raw = bytes.fromhex(record["handle"])
    if len(raw) != 64:
        raise ValueError(f"an IPC handle is 64 bytes, not {len(raw)}")
    handle.reserved = (ctypes.c_uint8 * 64)(*raw)
    base = ctypes.c_uint64()
    _check(lib.cuIpcOpenMemHandle_v2(ctypes.byref(base), handle, 1), "cuIpcOpenMemHandle")  # lazy peer access
    try:
        size = ctypes.c_size_t()
        _check(lib.cuMemGetAddressRange_v2(ctypes.byref(ctypes.c_uint64()), ctypes.byref(size), base),
               "cuMemGetAddressRange")
        if offset < 0 or offset + nbytes > size.value:
            raise ValueError(f"{nbytes} bytes at offset {offset} lie outside the {size.value}-byte allocation sent")
        mapped = torch.as_tensor(_Cai(base.value + offset, nbytes), device=device)
        copy = mapped.clone()
        torch.cuda.synchronize(device)
        del mapped
    finally:
        _check(lib.cuIpcCloseMemHandle(base), "cuIpcCloseMemHandle")
    return copy
