"""Calling a fast-format kernel library (runner/csrc/fusebot.h) from Python through ctypes."""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from runner.dtypes import ABI_DTYPES

MAX_DIMS = 8
HEADER = Path(__file__).resolve().parents[2] / "csrc" / "fusebot.h"

DTYPE_CODES = {getattr(torch, name): code for name, code in ABI_DTYPES.items()}  # (runner/dtypes.py)


class FbTensor(ctypes.Structure):
    _fields_ = [
        ("data", ctypes.c_void_p),
        ("dtype", ctypes.c_int32),
        ("ndim", ctypes.c_int32),
        ("shape", ctypes.c_int64 * MAX_DIMS),
        ("strides", ctypes.c_int64 * MAX_DIMS),
    ]


class AbiError(Exception):
    """The library does not export the ABI, or the call returned an error code."""


def describe(t: torch.Tensor) -> FbTensor:
    if t.dim() > MAX_DIMS:
        raise AbiError(f"tensor has {t.dim()} dims; the ABI carries at most {MAX_DIMS}")
    if t.dtype not in DTYPE_CODES:
        raise AbiError(f"dtype {t.dtype} has no ABI code")
    s = FbTensor()
    s.data = t.data_ptr()
    s.dtype = DTYPE_CODES[t.dtype]
    s.ndim = t.dim()
    for i, (n, st) in enumerate(zip(t.shape, t.stride(), strict=True)):
        s.shape[i] = n
        s.strides[i] = st
    return s


class KernelLibrary:
    """A loaded shared library exporting `fusebot_forward`."""

    def __init__(self, path: Path):
        self.path = Path(path)
        self.lib = ctypes.CDLL(str(self.path))
        try:
            self._fwd = self.lib.fusebot_forward
        except AttributeError:
            raise AbiError(f"{self.path.name} does not export fusebot_forward") from None
        self._fwd.restype = ctypes.c_int
        self._fwd.argtypes = [
            ctypes.POINTER(FbTensor),
            ctypes.c_int32,
            ctypes.POINTER(FbTensor),
            ctypes.c_int32,
            ctypes.c_void_p,
        ]
        self._err = getattr(self.lib, "fusebot_last_error", None)
        if self._err is not None:
            self._err.restype = ctypes.c_char_p

    def __call__(self, inputs: list[torch.Tensor], outputs: list[torch.Tensor], stream: int | None) -> None:
        ins = (FbTensor * max(len(inputs), 1))(*[describe(t) for t in inputs])
        outs = (FbTensor * max(len(outputs), 1))(*[describe(t) for t in outputs])
        rc = self._fwd(ins, len(inputs), outs, len(outputs), ctypes.c_void_p(stream or 0))
        if rc != 0:
            detail = self._err().decode(errors="replace") if self._err is not None else ""
            raise AbiError(f"fusebot_forward returned {rc}" + (f": {detail}" if detail else ""))


def as_tensor_args(args: list, device: str) -> list[torch.Tensor]:
    """Forward arguments as tensors: a Python number becomes a 0-dim tensor on the device."""
    out = []
    for a in args:
        if isinstance(a, torch.Tensor):
            out.append(a)
        elif isinstance(a, bool | int | float):
            dtype = torch.bool if isinstance(a, bool) else torch.int64 if isinstance(a, int) else torch.float32
            out.append(torch.tensor(a, dtype=dtype, device=device))
        else:
            raise AbiError(f"forward argument of type {type(a).__name__} cannot cross the C ABI")
    return out
