"""GEMM / conv + epilogue: a KernelBench-format candidate whose ModelNew runs the heavy op through torch (cuBLAS,
cuDNN, or MKL on the CPU) and everything after it as one fused kernel of the catalog.

The fast C ABI cannot call torch, so the candidate is a Python file:
- it carries the reference's source and builds the reference `Model` inside ModelNew (same constructor, same seed,
  hence the same weights), and calls the heavy op on the reference's own submodule or with the same function;
- the fused epilogue is a catalog kernel (the fast-ABI source, inputs shifted by one: the heavy result comes first);
- CPU: compiled with g++ at import into a small CPython extension (its function runs under the harness's check that
  the candidate's own compiled code ran); CUDA: compiled with nvcc into a shared library called through ctypes on the
  current stream (its __global__ kernels are what the profiler must see).
"""

from __future__ import annotations

from pathlib import Path

from runner.catalog.ir import Program
from runner.catalog.recognition import Heavy
from runner.harness.build import CPU_FLAGS

HEADER = (Path(__file__).resolve().parents[1] / "csrc" / "fusebot.h").read_text()

_TORCH_FN = {"linear": "torch.nn.functional.linear", "matmul": "torch.matmul", "conv1d": "torch.nn.functional.conv1d",
             "conv2d": "torch.nn.functional.conv2d", "conv3d": "torch.nn.functional.conv3d", "addmm": "torch.addmm",
             "einsum": "torch.einsum"}

_CPU_WRAPPER = r"""
#define PY_SSIZE_T_CLEAN
#include <Python.h>
static int fb_parse(PyObject* item, fb_tensor* t) {
  PyObject *shape, *strides; unsigned long long ptr; int dtype;
  if (!PyArg_ParseTuple(item, "KiOO", &ptr, &dtype, &shape, &strides)) return -1;
  t->data = (void*)ptr; t->dtype = dtype; t->ndim = (int32_t)PyTuple_Size(shape);
  if (t->ndim > FB_MAX_DIMS) { PyErr_SetString(PyExc_ValueError, "too many dims"); return -1; }
  for (int d = 0; d < t->ndim; ++d) {
    t->shape[d] = PyLong_AsLongLong(PyTuple_GetItem(shape, d));
    t->strides[d] = PyLong_AsLongLong(PyTuple_GetItem(strides, d));
  }
  return 0;
}
static PyObject* fb_call(PyObject* self, PyObject* args) {
  PyObject *ins, *outs;
  if (!PyArg_ParseTuple(args, "OO", &ins, &outs)) return NULL;
  fb_tensor tin[64], tout[4];
  Py_ssize_t n_in = PyList_Size(ins), n_out = PyList_Size(outs);
  if (n_in > 64 || n_out > 4) { PyErr_SetString(PyExc_ValueError, "too many tensors"); return NULL; }
  for (Py_ssize_t k = 0; k < n_in; ++k) if (fb_parse(PyList_GetItem(ins, k), &tin[k])) return NULL;
  for (Py_ssize_t k = 0; k < n_out; ++k) if (fb_parse(PyList_GetItem(outs, k), &tout[k])) return NULL;
  int rc;
  Py_BEGIN_ALLOW_THREADS
  rc = fusebot_forward(tin, (int32_t)n_in, tout, (int32_t)n_out, NULL);
  Py_END_ALLOW_THREADS
  if (rc) { PyErr_SetString(PyExc_RuntimeError, fusebot_last_error()); return NULL; }
  Py_RETURN_NONE;
}
static PyMethodDef fb_methods[] = {{"call", fb_call, METH_VARARGS, "run the fused epilogue"}, {NULL, NULL, 0, NULL}};
static struct PyModuleDef fb_module = {PyModuleDef_HEAD_INIT, "fb_epilogue", NULL, -1, fb_methods};
PyMODINIT_FUNC PyInit_fb_epilogue(void) { return PyModule_Create(&fb_module); }
"""

_COMMON = r'''
import ctypes
import os
import subprocess
import sysconfig

import torch
import torch.nn as nn

_REFERENCE = {reference!r}
_ns = {{"__name__": "fusebot_reference"}}
exec(compile(_REFERENCE, "reference.py", "exec"), _ns)
_Reference = _ns["Model"]
_KERNEL = {kernel!r}
_CODES = {{torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int32: 4, torch.int64: 5,
          torch.bool: 6, torch.uint8: 7, torch.int8: 8}}
'''

_CPU_BUILD = r'''

def _build():
    so = os.path.join(os.getcwd(), "fb_epilogue" + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(so):
        src = os.path.join(os.getcwd(), "fb_epilogue.cpp")
        with open(src, "w") as f:
            f.write(_KERNEL)
        subprocess.run(["g++", {flags}
                        "-I", sysconfig.get_paths()["include"], src, "-o", so], check=True)
    import importlib.util
    spec = importlib.util.spec_from_file_location("fb_epilogue", so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_ext = _build()


def _desc(t):
    return (t.data_ptr(), _CODES[t.dtype], tuple(t.shape), tuple(t.stride()))


def _run(ins, out):
    _ext.call([_desc(t) for t in ins], [_desc(out)])
'''

_CUDA_BUILD = r'''

class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


def _build():
    so = os.path.join(os.getcwd(), "libfb_epilogue.so")
    if not os.path.exists(so):
        src = os.path.join(os.getcwd(), "fb_epilogue.cu")
        with open(src, "w") as f:
            f.write(_KERNEL)
        major, minor = torch.cuda.get_device_capability()
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", {flags}
                        f"-gencode=arch=compute_{{major}}{{minor}},code=sm_{{major}}{{minor}}", src, "-o", so], check=True)
    lib = ctypes.CDLL(so)
    lib.fusebot_forward.restype = ctypes.c_int
    lib.fusebot_last_error.restype = ctypes.c_char_p
    return lib


_lib = _build()


def _desc(t):
    s = _Tensor()
    s.data, s.dtype, s.ndim = t.data_ptr(), _CODES[t.dtype], t.dim()
    for d in range(t.dim()):
        s.shape[d], s.strides[d] = t.shape[d], t.stride(d)
    return s


def _run(ins, out):
    tin = (_Tensor * len(ins))(*[_desc(t) for t in ins])
    tout = (_Tensor * 1)(_desc(out))
    rc = _lib.fusebot_forward(tin, len(ins), tout, 1, ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc:
        raise RuntimeError(_lib.fusebot_last_error().decode())
'''

_MODEL = r'''

class ModelNew(nn.Module):
    """The reference's {op} on torch, then the fused epilogue as one kernel."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.ref = _Reference(*args, **kwargs)

    def forward(self, *xs):
        params = list(self.ref.state_dict().values())
        t = [*xs, *params]
        h = {heavy}
        ins = [h, *t]
        shape = {out_shape}
        out = torch.empty(shape, dtype={dtype}, device=h.device)
        _run(ins, out)
        return out
'''


def _heavy_call(h: Heavy) -> str:
    def arg(a) -> str:
        if isinstance(a, dict) and "abi" in a:
            return f"t[{a['abi']}]" + (".T" if a.get("t") else "")
        return repr(a)

    if h.module:
        return f"self.ref.get_submodule({h.module!r})({', '.join(arg(a) for a in h.call_args)})"
    fn = _TORCH_FN.get(h.op)
    if fn is None:
        raise ValueError(f"no torch function for {h.op}")
    kw = ", ".join(f"{k}={v!r}" for k, v in h.kwargs.items() if k not in ("module", "params"))
    return f"{fn}({', '.join([arg(a) for a in h.call_args] + ([kw] if kw else []))})"


def _out_shape(p: Program) -> str:
    """The output's shape at run time: the broadcast of the inputs for an elementwise or full-size output."""
    if not p.is_row or p.level(p.out) == "full":
        if all(not inp.viewed for inp in p.inputs):
            return "torch.broadcast_shapes(" + ", ".join(
                f"{'h' if inp.abi == -1 else f't[{inp.abi}]'}.shape" for inp in p.inputs) + ")"
    return repr(tuple(p.out_shape))


def render(p: Program, heavy: Heavy, kernel_source: str, backend: str, reference_source: str,
           extra_flags: list[str] | None = None) -> str:
    """candidate.py of an epilogue candidate; `kernel_source` is the catalog kernel rendered with abi_offset=1."""
    flags = "".join(f"{f!r}, " for f in (extra_flags or []))
    cpu_flags = "".join(f"{f!r}, " for f in CPU_FLAGS)  # the harness's own (runner/harness/build.py)
    kernel = kernel_source.replace('#include "fusebot.h"', HEADER)
    if backend == "cpu":
        kernel += _CPU_WRAPPER
        build = _CPU_BUILD.replace("{flags}", cpu_flags + flags)
    else:
        build = _CUDA_BUILD.replace("{flags}", flags).replace("{{", "{").replace("}}", "}")
    dtype = f"torch.{p.out_dtype}"
    head = _COMMON.format(reference=reference_source, kernel=kernel)
    model = _MODEL.format(op=heavy.op, heavy=_heavy_call(heavy), out_shape=_out_shape(p), dtype=dtype)
    return f'"""fusebot catalog: {heavy.op} on torch + one fused epilogue kernel ({backend})."""\n' + head + build + model
