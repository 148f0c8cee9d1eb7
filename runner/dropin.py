"""The drop-in module and its test: pure functions from a problem and a kernel to Python source text.

The drop-in is a subclass of the user's class (same constructor, same state_dict keys) whose forward calls the fast
kernel through ctypes with the fb_tensor ABI of runner/csrc/fusebot.h. It is self-contained: it never imports
fusebot. On first use it compiles the kernel next to it (C++ by the system compiler, CUDA-C by nvcc for the GPU it
runs on) into a cache keyed by a hash of the sources, the flags and the compiler's version.

Files the drop-in expects beside it: the kernel source, fusebot.h, and for a KernelBench-format problem the
reference file as `reference.py`.
"""

from __future__ import annotations

from runner.contract import DEFAULT_TOLERANCE, ProblemSpec

# The harness's flags (runner/build.py), so the drop-in runs the code the harness measured, built the same way.
CPU_FLAGS = ["-O3", "-march=native", "-std=c++17", "-shared", "-fPIC", "-fopenmp"]
CUDA_FLAGS = ["-O3", "-std=c++17", "-shared", "-Xcompiler", "-fPIC"]

DROPIN_FILE = "dropin.py"
TEST_FILE = "test_dropin.py"
REFERENCE_FILE = "reference.py"
HEADER_FILE = "fusebot.h"


def kernel_filename(backend: str) -> str:
    return "kernel.cu" if backend == "cuda" else "kernel.cpp"


def _import_original(problem: ProblemSpec) -> str:
    """Source that binds `_ref` (the module with the reference class and input factories) and `Original`."""
    if problem.path:
        return (
            "_spec = importlib.util.spec_from_file_location(\n"
            "    'fusebot_reference_' + hashlib.sha256(str(_HERE).encode()).hexdigest()[:12],\n"
            f"    _HERE / {REFERENCE_FILE!r})\n"
            "_ref = importlib.util.module_from_spec(_spec)\n"
            "sys.modules[_spec.name] = _ref\n"
            "_spec.loader.exec_module(_ref)\n"
            f"Original = _ref.{problem.class_name}\n"
        )
    return f"_ref = importlib.import_module({problem.module!r})\nOriginal = _ref.{problem.class_name}\n"


_RUNTIME = '''
class _FbTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int32: 4, torch.int64: 5,
           torch.bool: 6, torch.uint8: 7, torch.int8: 8}
_LOCK = threading.Lock()
_LIB = None


def _describe(t):
    s = _FbTensor()
    s.data, s.dtype, s.ndim = t.data_ptr(), _DTYPES[t.dtype], t.dim()
    for i, (n, st) in enumerate(zip(t.shape, t.stride())):
        s.shape[i], s.strides[i] = n, st
    return s


def _compile():
    """Build the kernel once per (sources, flags, compiler) into a cache; return the library's path."""
    flags = list(FLAGS)
    if BACKEND == "cuda":
        major, minor = torch.cuda.get_device_capability()
        flags.append(f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}")
        compiler = shutil.which("nvcc") or "nvcc"
    else:
        compiler = os.environ.get("CXX", "g++")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256()
    for part in ((_HERE / KERNEL).read_bytes(), (_HERE / "fusebot.h").read_bytes(), " ".join(flags).encode(),
                 version.encode()):
        h.update(part + b"\\0")
    root = Path(os.environ.get("FUSEBOT_DROPIN_CACHE") or Path(tempfile.gettempdir()) / "fusebot-dropin")
    lib = root / h.hexdigest()[:32] / "kernel.so"
    if not lib.exists():
        lib.parent.mkdir(parents=True, exist_ok=True)
        tmp = lib.parent / f".kernel.{os.getpid()}.so"
        cmd = [compiler, *flags, "-I", str(_HERE), "-o", str(tmp), str(_HERE / KERNEL)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise RuntimeError(f"building {KERNEL} failed:\\n{done.stdout}{done.stderr}")
        os.replace(tmp, lib)
    return lib


def _library():
    global _LIB
    with _LOCK:
        if _LIB is None:
            lib = ctypes.CDLL(str(_compile()))
            lib.fusebot_forward.restype = ctypes.c_int
            lib.fusebot_forward.argtypes = [ctypes.POINTER(_FbTensor), ctypes.c_int32, ctypes.POINTER(_FbTensor),
                                            ctypes.c_int32, ctypes.c_void_p]
            _LIB = lib
    return _LIB


def _as_tensor(a, device):
    if isinstance(a, torch.Tensor):
        return a.contiguous()
    if isinstance(a, (bool, int, float)):
        dtype = torch.bool if isinstance(a, bool) else torch.int64 if isinstance(a, int) else torch.float32
        return torch.tensor(a, dtype=dtype, device=device)
    raise TypeError(f"argument of type {type(a).__name__} cannot cross the kernel's C ABI")
'''

_CLASS = '''

class {name}(Original):
    """{name} with its forward computed by the fused kernel in {kernel} (found and verified by fusebot).

    Same constructor and state_dict as the original. Forward-only: when autograd needs a graph (grad enabled and an
    input or parameter requires grad), the original forward runs instead, so training is unchanged.
    """

    kernel_calls = 0

    def forward(self, *args):
        state = list(self.state_dict(keep_vars=True).values())
        tensors = [a for a in args if isinstance(a, torch.Tensor)] + state
        if torch.is_grad_enabled() and any(t.requires_grad for t in tensors):
            return super().forward(*args)
        device = next((t.device for t in tensors), torch.device("cpu"))
        inputs = [_as_tensor(a, device) for a in args] + [t.detach().contiguous() for t in state]
        key = tuple((tuple(t.shape), t.dtype, t.device) for t in inputs)
        spec = self.__dict__.setdefault("_fusebot_out_specs", {{}}).get(key)
        if spec is None:  # output shapes and dtypes for these inputs: from the original, once per signature
            with torch.no_grad():
                ref = super().forward(*args)
            spec = (isinstance(ref, torch.Tensor), [(r.shape, r.dtype) for r in
                                                     ([ref] if isinstance(ref, torch.Tensor) else ref)])
            self._fusebot_out_specs[key] = spec
        single, shapes = spec
        outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in shapes]
        ins = (_FbTensor * max(len(inputs), 1))(*[_describe(t) for t in inputs])
        outs = (_FbTensor * max(len(outputs), 1))(*[_describe(t) for t in outputs])
        stream = torch.cuda.current_stream(device).cuda_stream if device.type == "cuda" else None
        rc = _library().fusebot_forward(ins, len(inputs), outs, len(outputs), ctypes.c_void_p(stream or 0))
        if rc != 0:
            raise RuntimeError(f"fusebot_forward returned {{rc}}")
        type(self).kernel_calls += 1
        return outputs[0] if single else tuple(outputs)
'''


def dropin_source(problem: ProblemSpec, backend: str, extra_cflags: list[str] | None = None,
                  kernel_sha256: str = "") -> str:
    """The drop-in module for a fast-format kernel of `problem` on `backend`."""
    kernel = kernel_filename(backend)
    flags = (CUDA_FLAGS if backend == "cuda" else CPU_FLAGS) + list(extra_cflags or [])
    head = (
        f'"""Drop-in replacement for {problem.class_name} ({problem.name}), generated by fusebot.\n\n'
        f"Kernel: {kernel}" + (f" (sha256 {kernel_sha256})" if kernel_sha256 else "") + f", backend {backend}.\n"
        f"Use `{problem.class_name}` from this module where the original class was used; load the original's\n"
        'state_dict into it unchanged.\n"""\n\n'
        "import ctypes\nimport hashlib\nimport importlib\nimport importlib.util\nimport os\nimport shutil\n"
        "import subprocess\nimport sys\nimport tempfile\nimport threading\nfrom pathlib import Path\n\nimport torch\n\n"
        "_HERE = Path(__file__).resolve().parent\n"
        f"KERNEL = {kernel!r}\nBACKEND = {backend!r}\nFLAGS = {flags!r}\n\n"
    )
    return head + _import_original(problem) + _RUNTIME + _CLASS.format(name=problem.class_name, kernel=kernel)


def _tolerance(problem: ProblemSpec) -> tuple[float, float]:
    atol, rtol = DEFAULT_TOLERANCE[problem.dtype or "float32"]
    return (problem.atol if problem.atol is not None else atol, problem.rtol if problem.rtol is not None else rtol)


def dropin_test_source(problem: ProblemSpec, backend: str, seeds: int = 5) -> str:
    """A pytest module comparing the drop-in with the original over several seeds (skipped without CUDA for a CUDA
    kernel)."""
    atol, rtol = _tolerance(problem)
    init = f"_resolve({problem.init_inputs!r})()" if problem.init_inputs else repr(problem.init_args)
    dtype = f"torch.{problem.dtype}" if problem.dtype else "None"
    device = "cuda" if backend == "cuda" else "cpu"
    skip = ('pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel is CUDA; no GPU")\n'
            if backend == "cuda" else "")
    return f'''"""The fused drop-in for {problem.name} against the original {problem.class_name}, by fusebot."""

import importlib
import importlib.util
import sys
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("fusebot_dropin_{problem.name}", Path(__file__).with_name("dropin.py"))
dropin = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = dropin
_spec.loader.exec_module(dropin)
{skip}
DEVICE = {device!r}
DTYPE = {dtype}
ATOL, RTOL = {atol!r}, {rtol!r}


def _resolve(ref):
    if ":" in ref:
        mod, name = ref.split(":", 1)
        return getattr(importlib.import_module(mod), name)
    return getattr(dropin._ref, ref)


def _to(x):
    if isinstance(x, torch.Tensor):
        x = x.to(DEVICE)
        return x.to(DTYPE) if DTYPE is not None and x.is_floating_point() else x
    return x


def _pair(seed):
    torch.manual_seed(seed)
    init = {init}
    original = dropin.Original(*init, **{problem.init_kwargs!r}).to(DEVICE).eval()
    fused = dropin.{problem.class_name}(*init, **{problem.init_kwargs!r}).to(DEVICE).eval()
    if DTYPE is not None:
        original, fused = original.to(DTYPE), fused.to(DTYPE)
    fused.load_state_dict(original.state_dict())
    return original, fused


def test_same_state_dict_keys_and_class():
    original, fused = _pair(0)
    assert list(fused.state_dict()) == list(original.state_dict())
    assert isinstance(fused, dropin.Original)


@pytest.mark.parametrize("seed", range({seeds}))
def test_dropin_matches_original(seed):
    original, fused = _pair(seed)
    inputs = [_to(x) for x in _resolve({problem.inputs!r})()]
    calls = dropin.{problem.class_name}.kernel_calls
    with torch.no_grad():
        want = original(*inputs)
        got = fused(*inputs)
    assert dropin.{problem.class_name}.kernel_calls == calls + 1, "the fused kernel did not run"
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
'''
