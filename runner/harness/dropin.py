"""The drop-in module: a pure function from a problem and a kernel to Python source text (its test: dropin_test.py).

The drop-in is a subclass of the user's class (same constructor, same state_dict keys) whose forward calls the fast
kernel through a `torch.library` custom op, so torch.compile and CUDA graphs see one opaque op with a fake (shape)
implementation. The op's real implementation calls the kernel through ctypes with the fb_tensor ABI of
runner/csrc/fusebot.h. Its backward recomputes the original module's forward under autograd (the search produces
forward kernels only). It is self-contained: it never imports fusebot. On first use it compiles the kernel next to it
(C++ by the system compiler, CUDA-C by nvcc for the GPU it runs on) into a cache keyed by a hash of the sources, the
flags and the compiler's version; when it cannot build for this machine it says why.

Files the drop-in expects beside it: the kernel source, fusebot.h, and for a KernelBench-format problem the
reference file as `reference.py`. A repository module is imported by name, with the repository root (found from the
drop-in's own place in the kernels directory) put on sys.path when the module is not importable already.
"""

from __future__ import annotations

import re

from runner.contract import ProblemSpec
from runner.harness import build

# The harness's flags (runner/harness/build.py), so the drop-in runs the code the harness measured, built the same way.
CPU_FLAGS = list(build.CPU_FLAGS)
CUDA_FLAGS = list(build.CUDA_FLAGS)

DROPIN_FILE = "dropin.py"
REFERENCE_FILE = "reference.py"
HEADER_FILE = "fusebot.h"


def kernel_filename(backend: str) -> str:
    return "kernel.cu" if backend == "cuda" else "kernel.cpp"


def op_name(problem: ProblemSpec, kernel_sha256: str = "") -> str:
    """The custom op's name: `fusebot::<target>_<sha8>` (a valid identifier)."""
    slug = re.sub(r"[^0-9A-Za-z_]+", "_", problem.name).strip("_").lower() or "target"
    return f"fusebot::{slug}_{(kernel_sha256 or '0' * 8)[:8]}"


def _import_original(problem: ProblemSpec, root_depth: int | None) -> str:
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
    if root_depth is None:
        return f"_ref = importlib.import_module({problem.module!r})\nOriginal = _ref.{problem.class_name}\n"
    return (
        "try:\n"
        f"    _ref = importlib.import_module({problem.module!r})\n"
        "except ModuleNotFoundError:  # run from outside the repository: its root is known from this file's place\n"
        f"    sys.path.insert(0, str(_HERE.parents[{root_depth}]))\n"
        f"    _ref = importlib.import_module({problem.module!r})\n"
        f"Original = _ref.{problem.class_name}\n"
    )


_RUNTIME = '''
log = logging.getLogger(__name__)


class _FbTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


_DTYPES = {torch.float32: 0, torch.float16: 1, torch.bfloat16: 2, torch.float64: 3, torch.int32: 4, torch.int64: 5,
           torch.bool: 6, torch.uint8: 7, torch.int8: 8}
_LOCK = threading.Lock()
_LIB = None


class BuildError(RuntimeError):
    """The kernel cannot be built or run on this machine; the message says why and what to do."""


_PACK = struct.Struct("<qii8q8q")  # _FbTensor's bytes: one pack per tensor, not a ctypes field write per number


def _describe_all(tensors):
    """The fb_tensor array for `tensors` (at least one element: the ABI's arrays are never empty)."""
    parts = []
    for t in tensors:
        pad = (0,) * (8 - t.dim())
        parts.append(_PACK.pack(t.data_ptr(), _DTYPES[t.dtype], t.dim(), *t.shape, *pad, *t.stride(), *pad))
    return (_FbTensor * max(len(parts), 1)).from_buffer_copy(b"".join(parts) or bytes(_PACK.size))


def _nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    found = shutil.which("nvcc") or (home and shutil.which("nvcc", path=str(Path(home) / "bin")))
    if not found:
        raise BuildError(f"nvcc was not found (PATH, CUDA_HOME): the CUDA kernel {KERNEL} is built for the GPU it runs "
                         f"on, so this machine needs the CUDA toolkit (it was verified on {BUILT_FOR}); "
                         "meanwhile use `Original`, the unchanged class")
    return found


def _compile():
    """Build the kernel once per (sources, flags, compiler) into a cache; return the library's path."""
    flags = list(FLAGS)
    if BACKEND == "cuda":
        if not torch.cuda.is_available():
            raise BuildError(f"{KERNEL} is a CUDA kernel and torch sees no CUDA GPU here; use `Original` on this "
                             "machine")
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
        if arch not in BUILT_FOR:
            log.warning("fusebot drop-in: building %s for %s (%s); it was verified on %s: run test_dropin.py here "
                        "before relying on it", KERNEL, arch, torch.cuda.get_device_name(), BUILT_FOR)
        flags.append(f"-gencode=arch=compute_{major}{minor},code={arch}")
        compiler = _nvcc()
    else:
        arch = "cpu"
        compiler = os.environ.get("CXX", "g++")
        if not shutil.which(compiler):
            raise BuildError(f"no C++ compiler ({compiler}) on PATH to build {KERNEL}; set CXX or install g++")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256()  # -march=native builds for this CPU: its model is part of the key
    for part in ((_HERE / KERNEL).read_bytes(), (_HERE / "fusebot.h").read_bytes(), " ".join(flags).encode(),
                 version.encode(), arch.encode(), os.uname().machine.encode(), _cpu_model().encode()):
        h.update(part + b"\\0")
    lib = _cache_root() / h.hexdigest() / "kernel.so"
    if not _intact(lib):
        lib.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = lib.parent / f".kernel.{os.getpid()}.so"
        cmd = [compiler, *flags, "-I", str(_HERE), "-o", str(tmp), str(_HERE / KERNEL)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            text = done.stdout + done.stderr
            if "Unsupported gpu architecture" in text or "unsupported gpu architecture" in text.lower():
                raise BuildError(f"this nvcc cannot build for {arch} (this GPU); the kernel was verified on "
                                 f"{BUILT_FOR}: install a CUDA toolkit that supports {arch}\\n{text}")
            raise BuildError(f"building {KERNEL} for {arch} failed:\\n{text}")
        digest = hashlib.sha256(tmp.read_bytes()).hexdigest()
        (lib.parent / f".sha256.{os.getpid()}").write_text(digest)
        os.replace(lib.parent / f".sha256.{os.getpid()}", lib.parent / "kernel.so.sha256")
        os.replace(tmp, lib)
        if not _intact(lib):
            raise BuildError(f"the kernel library just built at {lib} changed before it was loaded")
    return lib


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("model name", "flags")):
                return line  # the first "model name" (and, on machines without one, the features)
    except OSError:
        pass
    return ""


def _private(path):
    """Whether `path` is a real directory or file of this user that nobody else may write to."""
    st = os.lstat(path)
    return not stat.S_ISLNK(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _cache_root():
    """The per-user build cache: $FUSEBOT_DROPIN_CACHE, else $XDG_CACHE_HOME/fusebot/dropin (~/.cache/...), created
    0700; refused when another user owns it or others may write to it (they could plant a library run here)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(os.environ.get("FUSEBOT_DROPIN_CACHE") or Path(base) / "fusebot" / "dropin")
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not _private(root):
        raise BuildError(f"the kernel cache {root} is not private to this user (a symlink, owned by another user, "
                         "or writable by others): remove it, or set FUSEBOT_DROPIN_CACHE to a directory only you "
                         "can write to")
    return root


def _intact(lib):
    """A cached library is loaded only when it, its folder and its recorded sha256 are this user's alone and the
    library's bytes still have that sha256."""
    record = lib.parent / "kernel.so.sha256"
    try:
        if not (_private(lib.parent) and _private(lib) and _private(record)):
            return False
        return hashlib.sha256(lib.read_bytes()).hexdigest() == record.read_text().strip()
    except OSError:
        return False


def _bind(path):
    """The kernel library at `path`, its entry point typed for this module's descriptors."""
    lib = ctypes.CDLL(str(path))
    lib.fusebot_forward.restype = ctypes.c_int
    lib.fusebot_forward.argtypes = [ctypes.POINTER(_FbTensor), ctypes.c_int32, ctypes.POINTER(_FbTensor),
                                    ctypes.c_int32, ctypes.c_void_p]
    return lib


def _library():
    global _LIB
    with _LOCK:
        if _LIB is None:
            _LIB = _bind(_compile())
    return _LIB


# ---- the module registry: the op's fake and backward run the original forward of the module that called it -----
_MODULES = {}
_KEYS = itertools.count(1)
_REFERENCE = threading.local()


def _module(key):
    ref = _MODULES.get(key)
    module = ref() if ref is not None else None
    if module is None:
        raise RuntimeError(f"the module behind {OP_NAME} (key {key}) no longer exists")
    return module


def _reference(key, args, state):
    """The original forward of module `key` with `state` (state_dict order) in place of its own tensors."""
    module = _module(key)
    _REFERENCE.on = getattr(_REFERENCE, "on", 0) + 1
    try:
        out = torch.func.functional_call(module, dict(zip(module._fusebot_state_names, state)), tuple(args))
    finally:
        _REFERENCE.on -= 1
    module._fusebot_single = isinstance(out, torch.Tensor)  # a tensor, or a tuple of them: returned alike
    return [out] if isinstance(out, torch.Tensor) else list(out)


def _out_specs(key, args, state):
    """Output shapes and dtypes for these inputs: the original forward on meta tensors (or for real, once)."""
    module = _module(key)
    sig = tuple((tuple(t.shape), t.dtype, t.device) for t in [*args, *state])
    cache = module.__dict__.setdefault("_fusebot_out_specs", {})
    if sig not in cache:
        with torch.no_grad():
            try:
                outs = _reference(key, [t.to("meta") for t in args], [t.to("meta") for t in state])
            except Exception:  # noqa: BLE001 - an op without a meta kernel: run it once for real
                outs = _reference(key, list(args), list(state))
        cache[sig] = [(tuple(o.shape), o.dtype) for o in outs]
    return cache[sig]


def _free_op_name(name):
    """OP_NAME, or OP_NAME_<n> when this file is loaded a second time under another module name."""
    ns, base = name.split("::")
    for n in itertools.count():
        candidate = base if n == 0 else f"{base}_{n}"
        try:
            getattr(getattr(torch.ops, ns), candidate)
        except (AttributeError, RuntimeError):
            return f"{ns}::{candidate}"


def _run(args, state, key):
    """The kernel: `args` are the forward's arguments, `state` the module's tensors in state_dict order."""
    inputs = [t.contiguous() for t in [*args, *state]]
    device = inputs[0].device if inputs else torch.device("cpu")
    outputs = [torch.empty(shape, dtype=dtype, device=device) for shape, dtype in _out_specs(key, args, state)]
    # the current stream's handle as torch.compile's own generated code reads it (a Stream object costs microseconds)
    stream = torch._C._cuda_getCurrentRawStream(device.index) if device.type == "cuda" else None
    rc = _library().fusebot_forward(_describe_all(inputs), len(inputs), _describe_all(outputs), len(outputs),
                                    ctypes.c_void_p(stream or 0))
    if rc != 0:
        raise RuntimeError(f"fusebot_forward returned {rc}")
    _count()
    return outputs


@torch.library.custom_op(_free_op_name(OP_NAME), mutates_args=())
def fused(args: list[torch.Tensor], state: list[torch.Tensor], key: int) -> list[torch.Tensor]:
    """The kernel as a custom op: what torch.compile, autograd and tensor subclasses see."""
    return _run(args, state, key)


_PLAIN = (torch.Tensor, torch.nn.Parameter)


def _plain_eager(tensors):
    """A call the op's dispatch adds nothing to: not being compiled, plain tensors, no graph for autograd to record
    (the op's dispatch cost ~20-40 us a call, as much as a short kernel's run)."""
    if torch.compiler.is_compiling():
        return False
    grad = torch.is_grad_enabled()
    return all(type(t) in _PLAIN and not t.is_meta and not (grad and t.requires_grad) for t in tensors)


@fused.register_fake
def _fused_fake(args, state, key):
    return [torch.empty(o.shape, dtype=o.dtype, device=o.device) for o in _reference(key, args, state)]


def _setup_context(ctx, inputs, output):
    args, state, key = inputs
    ctx.key, ctx.n_args = key, len(args)
    ctx.save_for_backward(*args, *state)


def _backward(ctx, grads):
    """Backward through the original module's operations: recompute its forward under autograd."""
    saved = ctx.saved_tensors
    leaves = [t.detach().requires_grad_(t.is_floating_point() or t.is_complex()) for t in saved]
    with torch.enable_grad():
        outs = _reference(ctx.key, leaves[: ctx.n_args], leaves[ctx.n_args:])
    pairs = [(o, g) for o, g in zip(outs, grads) if g is not None and o.requires_grad]
    wanted = [t for t in leaves if t.requires_grad]
    got = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True)
               if pairs and wanted else [None] * len(wanted))
    result = [next(got) if t.requires_grad else None for t in leaves]
    return result[: ctx.n_args], result[ctx.n_args:], None


fused.register_autograd(_backward, setup_context=_setup_context)
'''

_CLASS = '''

class {name}(Original):
    """{name} with its forward computed by the fused kernel in {kernel} (found and verified by fusebot).

    Same constructor and state_dict as the original, so its checkpoints load unchanged. The forward is the custom op
    `{op}` wherever torch.compile, autograd or a tensor subclass is involved, and the same kernel called directly
    otherwise (a plain eager call skips the op's dispatch); gradients flow through the original forward, recomputed.
    """

    kernel_calls = 0

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._fusebot_key = next(_KEYS)
        _MODULES[self._fusebot_key] = weakref.ref(self)
        self._fusebot_state_names = list(self.state_dict(keep_vars=True))
        self._fusebot_slots = [(tuple(n.split(".")[:-1]), n.split(".")[-1]) for n in self._fusebot_state_names]

    def _fusebot_state(self):
        """The module's tensors in state_dict order, looked up where they live now (a replaced parameter or
        submodule is seen), without walking every submodule as named_parameters() does."""
        out = []
        for path, leaf in self._fusebot_slots:
            m = self
            for p in path:
                m = m._modules[p]
            t = m._parameters.get(leaf)
            out.append(t if t is not None else m._buffers[leaf])
        return out

    def forward(self, *args):
        if getattr(_REFERENCE, "on", 0):
            return super().forward(*args)
        state = self._fusebot_state()
        device = next((t.device for t in [*args, *state] if isinstance(t, torch.Tensor)), torch.device("cpu"))
        tensors = [a if isinstance(a, torch.Tensor) else torch.tensor(a, device=device) for a in args]
        if _plain_eager([*tensors, *state]):
            out = _run(tensors, state, self._fusebot_key)
        else:
            out = fused(tensors, state, self._fusebot_key)
        return out[0] if self.__dict__.get("_fusebot_single", SINGLE_OUTPUT) else tuple(out)


def _count():
    {name}.kernel_calls += 1
'''


def dropin_source(problem: ProblemSpec, backend: str, extra_cflags: list[str] | None = None,
                  kernel_sha256: str = "", *, built_for: str = "", root_depth: int | None = None,
                  single_output: bool = True) -> str:
    """The drop-in module for a fast-format kernel of `problem` on `backend`.

    `built_for` names the device the kernel was verified on (e.g. "NVIDIA H100 80GB HBM3 (sm_90)"); `root_depth` is
    how many folders above the drop-in's folder the repository root is (for a repository module)."""
    kernel = kernel_filename(backend)
    flags = (CUDA_FLAGS if backend == "cuda" else CPU_FLAGS) + list(extra_cflags or [])
    head = (
        f'"""Drop-in replacement for {problem.class_name} ({problem.name}), generated by fusebot.\n\n'
        f"Kernel: {kernel}" + (f" (sha256 {kernel_sha256})" if kernel_sha256 else "") + f", backend {backend}.\n"
        f"Use `{problem.class_name}` from this module where the original class was used; load the original's\n"
        'state_dict into it unchanged.\n"""\n\n'
        "import ctypes\nimport hashlib\nimport importlib\nimport importlib.util\nimport itertools\nimport logging\n"
        "import os\nimport shutil\nimport stat\nimport struct\nimport subprocess\nimport sys\nimport threading\n"
        "import weakref\n"
        "from pathlib import Path\n\nimport torch\n\n"
        "_HERE = Path(__file__).resolve().parent\n"
        f"KERNEL = {kernel!r}\nBACKEND = {backend!r}\nFLAGS = {flags!r}\n"
        f"BUILT_FOR = {(built_for or backend)!r}\nOP_NAME = {op_name(problem, kernel_sha256)!r}\n"
        f"SINGLE_OUTPUT = {single_output!r}\n\n"
    )
    return (head + _import_original(problem, root_depth) + _RUNTIME
            + _CLASS.format(name=problem.class_name, kernel=kernel, op=op_name(problem, kernel_sha256)))
