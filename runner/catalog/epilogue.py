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

from dataclasses import replace
from pathlib import Path

from runner.catalog.ir import Program
from runner.catalog.pattern import Heavy, Pattern
from runner.catalog.schedule import Plan, stage_of, view_calls
from runner.harness.build import CPU_FLAGS

HEADER = (Path(__file__).resolve().parents[1] / "csrc" / "fusebot.h").read_text()

_TORCH_FN = {"linear": "torch.nn.functional.linear", "matmul": "torch.matmul", "conv1d": "torch.nn.functional.conv1d",
             "conv2d": "torch.nn.functional.conv2d", "conv3d": "torch.nn.functional.conv3d", "addmm": "torch.addmm",
             "einsum": "torch.einsum", "conv_transpose1d": "torch.nn.functional.conv_transpose1d",
             "conv_transpose2d": "torch.nn.functional.conv_transpose2d",
             "conv_transpose3d": "torch.nn.functional.conv_transpose3d"}

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


# ---- several stages: heavy ops on torch, fused programs between them ------------------------------------------------

_GRAPH_MODEL = r'''

class ModelNew(nn.Module):
    """The reference's heavy ops on torch, the work between them as fused kernels ({n} stages)."""

    def __init__(self, *args, **kwargs):
        super().__init__()
        self.ref = _Reference(*args, **kwargs)

    def forward(self, *xs):
        params = list(self.ref.state_dict().values())
        consts = [_attr(self.ref, name) for name in {consts!r}]  # tensors the state_dict does not hold
        t = [*xs, *params, *consts]
        dev = t[0].device
        r = []
{body}


def _attr(obj, name):
    for part in name.split("."):
        obj = getattr(obj, part)
    return obj
'''


def stage_program(p: Program) -> tuple[Program, list[tuple[int, int]]]:
    """The program with its inputs renumbered for a stage's call: earlier stages' results first (positions 0..m-1,
    in the returned order of (stage, output)), then the ABI tensors shifted by m."""
    refs = list(dict.fromkeys(stage_of(i.abi) for i in p.inputs if i.abi < 0))
    m = len(refs)
    inputs = [replace(i, abi=refs.index(stage_of(i.abi)) if i.abi < 0 else i.abi + m) for i in p.inputs]
    return replace(p, inputs=inputs), refs


def _operand(g, a, done: dict[str, str]) -> str:
    if not (isinstance(a, dict) and "ref" in a):
        return repr(a)
    src, calls = view_calls(g, a["ref"])
    return done[src] + "".join(calls)


def render_graph(pat: Pattern, kernels: dict[int, str], backend: str, reference_source: str,
                 extra_flags: list[str] | None = None) -> str:
    """candidate.py of a scheduled graph; `kernels[j]` is fused stage j's source, rendered from stage_program()."""
    plan: Plan = pat.plan
    graph = plan.graph
    done: dict[str, str] = {}
    for n in graph.nodes:
        if n.op in ("input", "param", "constant_tensor") and n.index is not None:
            done[n.name] = f"t[{int(n.index)}]"
    lines = []
    for j, st in enumerate(plan.stages):
        if st.kind == "heavy":
            n = st.node
            fn = _TORCH_FN.get(n.op)
            if fn is None:
                raise ValueError(f"no torch function for {n.op}")
            args = [_operand(graph, a, done) for a in n.args]
            kw = [f"{k}={v!r}" for k, v in n.kwargs.items()]
            lines.append(f"r.append([{fn}({', '.join(args + kw)})])")
        else:
            prog, refs = stage_program(st.pattern.program)
            ins = [f"r[{s}][{o}]" for s, o in refs] + ["*t"]
            outs = [f"torch.empty({tuple(o.shape)!r}, dtype=torch.{o.dtype}, device=dev)" for o in prog.outputs]
            lines.append(f"o = [{', '.join(outs)}]")
            lines.append(f"_run({j}, [{', '.join(ins)}], o)")
            lines.append("r.append(o)")
        for m, name in enumerate(st.outputs):
            done[name] = f"r[{j}][{m}]"
    res = []
    for o in plan.outputs:
        base = f"t[{o['abi']}]" if "abi" in o else f"r[{o['stage']}][{o['out']}]"
        res.append(base + "".join(o["views"]))
    lines.append(f"return {res[0]}" if len(res) == 1 else f"return ({', '.join(res)})")
    body = "\n".join("        " + x for x in lines)
    flags = "".join(f"{f!r}, " for f in (extra_flags or []))
    if backend == "cpu":
        build = _STAGED_CPU.replace("{flags}", "".join(f"{f!r}, " for f in CPU_FLAGS) + flags)
    else:
        build = _STAGED_CUDA.replace("{flags}", flags)
    srcs = {j: k.replace('#include "fusebot.h"', HEADER) + (_CPU_WRAPPER.replace("fb_epilogue", f"fb_s{j}")
                                                           if backend == "cpu" else "")
            for j, k in kernels.items()}
    head = _COMMON.format(reference=reference_source, kernel=srcs)
    model = _GRAPH_MODEL.format(n=len(plan.stages), body=body, consts=list(graph.constants))
    return f'"""fusebot catalog: heavy ops on torch + fused kernels between them ({backend})."""\n' + head + build + model


_STAGED_CPU = r'''

def _build(j):
    name = f"fb_s{j}"
    so = os.path.join(os.getcwd(), name + sysconfig.get_config_var("EXT_SUFFIX"))
    if not os.path.exists(so):
        src = os.path.join(os.getcwd(), name + ".cpp")
        with open(src, "w") as f:
            f.write(_KERNEL[j])
        subprocess.run(["g++", {flags}
                        "-I", sysconfig.get_paths()["include"], src, "-o", so], check=True)
    import importlib.util
    spec = importlib.util.spec_from_file_location(name, so)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


_ext = {j: _build(j) for j in _KERNEL}


def _desc(t):
    return (t.data_ptr(), _CODES[t.dtype], tuple(t.shape), tuple(t.stride()))


def _run(j, ins, outs):
    _ext[j].call([_desc(x) for x in ins], [_desc(o) for o in outs])
'''

_STAGED_CUDA = r'''

class _Tensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


def _build(j):
    so = os.path.join(os.getcwd(), f"libfb_s{j}.so")
    if not os.path.exists(so):
        src = os.path.join(os.getcwd(), f"fb_s{j}.cu")
        with open(src, "w") as f:
            f.write(_KERNEL[j])
        major, minor = torch.cuda.get_device_capability()
        subprocess.run(["nvcc", "-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC", {flags}
                        f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}", src, "-o", so], check=True)
    lib = ctypes.CDLL(so)
    lib.fusebot_forward.restype = ctypes.c_int
    lib.fusebot_last_error.restype = ctypes.c_char_p
    return lib


_lib = {j: _build(j) for j in _KERNEL}


def _desc(t):
    s = _Tensor()
    s.data, s.dtype, s.ndim = t.data_ptr(), _CODES[t.dtype], t.dim()
    for d in range(t.dim()):
        s.shape[d], s.strides[d] = t.shape[d], t.stride(d)
    return s


def _run(j, ins, outs):
    tin = (_Tensor * len(ins))(*[_desc(x) for x in ins])
    tout = (_Tensor * len(outs))(*[_desc(o) for o in outs])
    rc = _lib[j].fusebot_forward(tin, len(ins), tout, len(outs), ctypes.c_void_p(torch.cuda.current_stream().cuda_stream))
    if rc:
        raise RuntimeError(_lib[j].fusebot_last_error().decode())
'''
