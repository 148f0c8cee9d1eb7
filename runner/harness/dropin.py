"""The drop-in module: a pure function from a problem and a kernel to Python source text (its test: dropin_test.py).

The drop-in is a subclass of the user's class (same constructor, state_dict and forward signature) whose forward
calls the fused kernel through ctypes and the C ABI of runner/csrc/fusebot.h, guarded: only for calls the kernel was
verified for, and for inference; everything else runs the original forward (runner/shipped/dropin/guard.py). Under
torch.compile the kernel is a `torch.library` custom op. It is self-contained (it never imports fusebot) and needs
nothing but torch at run time. A CUDA kernel ships device code only: its cubin (`kernel.<arch>.cubin.b64`, made
again from kernel.cu by the command its first line states), PTX for later GPUs and the launch plans of the verified
calls, run through the CUDA driver (runner/shipped/dropin/device.py, launch_plan.py); one whose launch plans cannot be
made ships no binary and builds kernel.cu where nvcc is present. A C++ kernel loads the library the runner shipped
beside it (`kernel.<arch>.so.b64`, its sha256 recorded here and checked), and builds from source only where that
library does not fit this host and a compiler is present (runner/shipped/dropin/runtime.py).

The drop-in's code is the package runner/shipped/dropin/, real modules read here as text (importlib.resources; never
imported: that package ranks above the harness): this module writes the head (docstring, imports, per-PR constants)
and the import of the original class, then each part below its line BODY, in the order of PARTS. What ships beside
it is built by dropin_ship.py (the device code and its plans; a C++ kernel's library).

Files the drop-in expects beside it: the kernel source, fusebot.h, the shipped device code or libraries it names, and for a
KernelBench-format problem the reference file as `reference.py`. A repository module is imported by name, with the
repository root (found from the drop-in's own place in the kernels directory) put on sys.path when the module is not
importable already.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from importlib import resources

from runner.contract import Candidate, ProblemSpec
from runner.dtypes import guard_table
from runner.harness import build, dropin_ship
from runner.harness.refs import inlined

# The harness's flags (runner/harness/build.py), so a drop-in built from source runs the code the harness measured.
CPU_FLAGS = list(build.CPU_FLAGS)
CUDA_FLAGS = list(build.CUDA_FLAGS)

DROPIN_FILE = "dropin.py"
REFERENCE_FILE = "reference.py"
HEADER_FILE = "fusebot.h"

PARTS = ("adopt", "runtime", "guard", "call", "device", "forward", "subclass")  # runner/shipped/dropin/<part>.py, in this order
BODY = "# ---- the drop-in from here on"  # a part's line above which its own imports (and stand-ins) stand
DTYPES_LINE = "# fusebot: abi dtypes"  # the guard's `_DTYPES = ...` line, written from runner/dtypes.py

_IMPORTS = ("base64", "ctypes", "hashlib", "importlib", "importlib.util", "inspect", "itertools", "logging", "os",
            "re", "shutil", "stat", "struct", "subprocess", "sys", "threading", "warnings", "zlib")


@functools.cache
def part(name: str) -> str:
    """The text a drop-in holds of its part `name`: runner/shipped/dropin/<name>.py below its line BODY, the
    resolver's import marked `# fusebot: inline` as its source (runner/harness/refs.py) and the line marked
    DTYPES_LINE as the dtype table (runner/dtypes.py)."""
    text = (resources.files("runner") / "shipped" / "dropin" / f"{name}.py").read_text()
    _, found, body = text.partition(BODY + "\n")
    if not found:
        raise ValueError(f"runner/shipped/dropin/{name}.py: no line {BODY!r}")
    return "".join(_abi_dtypes(inlined(line)) for line in body.splitlines(keepends=True))


def _abi_dtypes(line: str) -> str:
    if not line.rstrip().endswith(DTYPES_LINE):
        return line
    if not line.startswith("_DTYPES = "):
        raise ValueError(f"only the guard's `_DTYPES = ` line is written from runner/dtypes.py: {line.strip()}")
    return f"_DTYPES = {guard_table()}\n"


def kernel_filename(backend: str) -> str:
    return "kernel.cu" if backend == "cuda" else "kernel.cpp"


def op_name(problem: ProblemSpec, kernel_sha256: str = "") -> str:
    """The custom op's name: `fusebot::<target>_<sha8>` (a valid identifier)."""
    return f"fusebot::{_slug(problem.name)}_{(kernel_sha256 or '0' * 8)[:8]}"


def _slug(name: str) -> str:
    return re.sub(r"[^0-9A-Za-z_]+", "_", name).strip("_").lower() or "target"


def _import_original(problem: ProblemSpec, root_depth: int | None) -> str:
    """Source that binds `_ref` (the module with the reference class and input factories) and `Original`."""
    if problem.path:
        return (
            "_spec = importlib.util.spec_from_file_location(\n"
            "    'fusebot_reference_' + hashlib.sha256(str(_HERE).encode()).hexdigest()[:12],\n"
            f"    _HERE / {REFERENCE_FILE!r})\n"
            "if _spec.name in sys.modules:  # loaded already (this drop-in imported under another name)\n"
            "    _ref = sys.modules[_spec.name]\n"
            "else:\n"
            "    _ref = importlib.util.module_from_spec(_spec)\n"
            "    sys.modules[_spec.name] = _ref\n"
            "    _spec.loader.exec_module(_ref)\n"
            + _original(problem.class_name)
        )
    if root_depth is None:
        return f"_ref = importlib.import_module({problem.module!r})\n" + _original(problem.class_name)
    return (
        "try:\n"
        f"    _ref = importlib.import_module({problem.module!r})\n"
        "except ModuleNotFoundError:  # run from outside the repository: its root is known from this file's place\n"
        f"    sys.path.insert(0, str(_HERE.parents[{root_depth}]))\n"
        f"    _ref = importlib.import_module({problem.module!r})\n"
        + _original(problem.class_name)
    )


def _original(class_name: str) -> str:
    """Source binding `Original`: the module's class, or where the module adopted a drop-in, the class it replaced."""
    return f"Original = vars(_ref.{class_name}).get('fusebot_original', _ref.{class_name})\n"


def dropin_source(problem: ProblemSpec, backend: str, extra_cflags: list[str] | None = None,
                  kernel_sha256: str = "", *, built_for: str = "", root_depth: int | None = None,
                  single_output: bool = True, built_arch: str = "",
                  shipped: dict[str, tuple[str, str]] | None = None,
                  device_code: dict[str, tuple[str, str]] | None = None, plans: list[dict] | None = None) -> str:
    """The drop-in module for a fast-format kernel of `problem` on `backend`.

    `built_for` names the device the kernel was verified on (e.g. "NVIDIA H100 80GB HBM3 (CUDA 12.4)") and
    `built_arch` its arch ("sm_90"); `root_depth` is how many folders above the drop-in's folder the repository root
    is (for a repository module); `shipped` maps an arch to the shipped library beside the drop-in (file name, sha256
    of the library's bytes); `device_code` maps an arch ("sm_90", "compute_90") to the shipped cubin or PTX beside
    it (file name, sha256 of its bytes) and `plans` are its launch plans (runner/harness/launch_plan.py): with them
    the drop-in runs the kernel through the CUDA driver alone, at the verified calls."""
    kernel = kernel_filename(backend)
    flags = (CUDA_FLAGS if backend == "cuda" else CPU_FLAGS) + list(extra_cflags or [])
    op = op_name(problem, kernel_sha256)
    spec = {"inputs": problem.inputs if not problem.input_shapes else None, "second_inputs": problem.second_inputs,
            "input_shapes": problem.input_shapes, "dtype": problem.dtype, "init_inputs": problem.init_inputs,
            "init_args": problem.init_args, "init_kwargs": problem.init_kwargs}
    head = (
        f'"""Drop-in replacement for {problem.class_name} ({problem.name}), generated by fusebot.\n\n'
        f"Kernel: {kernel}" + (f" (sha256 {kernel_sha256})" if kernel_sha256 else "") + f", backend {backend}.\n"
        f"Use `{problem.class_name}` from this module where the original class was used (a module whose file ends\n"
        f"with `{problem.class_name} = adopt({problem.class_name})` does so itself); load the original's\n"
        "state_dict into it unchanged. The kernel runs only for calls it was verified for, and for inference;\n"
        "every other call runs the original forward. FUSEBOT_DISABLE=1 switches every drop-in off.\n"
        '"""\n\n'
        + "".join(f"import {m}\n" for m in _IMPORTS)
        + "from pathlib import Path\n\nimport torch\nimport torch.fx\n\n"
        "_HERE = Path(__file__).resolve().parent\n"
        f"KERNEL = {kernel!r}\nBACKEND = {backend!r}\nFLAGS = {flags!r}\n"
        f"BUILT_FOR = {(built_for or backend)!r}\nBUILT_ARCH = {built_arch!r}\n"
        f"SHIPPED = {dict(shipped or {})!r}  # arch -> (file beside this one, sha256 of the library)\n"
        f"DEVICE_CODE = {dict(device_code or {})!r}  # arch -> (cubin or PTX beside this one, sha256 of its bytes)\n"
        f"PLANS = {list(plans or [])!r}  # per verified call: the steps its host code launched\n"
        f"TARGET = {problem.name!r}\nOP_NAME = {op!r}\nSINGLE_OUTPUT = {single_output!r}\n"
        f"PROBLEM = {spec!r}\n\n"
    )
    first, *rest = (part(name) for name in PARTS)
    cls = rest.pop().replace("__NAME__", problem.class_name).replace("__KERNEL__", kernel).replace("__OP__", op)
    return head + first + "\n\n" + _import_original(problem, root_depth) + "".join(rest) + cls.replace(
        "__TARGET__", problem.name)


@dataclass(frozen=True)
class Shipped:
    """The drop-in and what ships beside it (file name -> text), and for a CUDA kernel without device code, why none
    ships ("" otherwise)."""

    files: dict[str, str]
    no_device_code: str = ""


def dropin_files(problem: ProblemSpec, candidate: Candidate, kernel_sha256: str = "", *, built_for: str = "",
                 root_depth: int | None = None, calls: list[dict] | None = None) -> dict[str, str]:
    """The drop-in and what ships beside it (name -> text): `shipped(...).files`."""
    return shipped(problem, candidate, kernel_sha256, built_for=built_for, root_depth=root_depth, calls=calls).files


def shipped(problem: ProblemSpec, candidate: Candidate, kernel_sha256: str = "", *, built_for: str = "",
            root_depth: int | None = None, calls: list[dict] | None = None) -> Shipped:
    """What a PR adds besides the kernel's source. A CUDA kernel (the catalog's, the seed proposer's or an LLM's) ships
    device code only: its cubin, PTX and the launch plans of the verified `calls` (dropin_ship.shipped_device_code);
    where those cannot be made, no binary at all (the drop-in builds kernel.cu where nvcc is present, else runs the
    original forward) and `no_device_code` says why. A C++ kernel ships the library built here for this CPU's level
    (dropin_ship.shipped_library), or, where it cannot be built, the drop-in alone."""
    if candidate.backend == "cuda":
        source = candidate.sources.get(kernel_filename("cuda")) or next(iter(candidate.sources.values()))
        dev = dropin_ship.shipped_device_code(source, list(calls or []))
        if isinstance(dev, dropin_ship.DeviceCode):
            text = dropin_source(problem, "cuda", candidate.extra_cflags, kernel_sha256, built_for=built_for,
                                 root_depth=root_depth, built_arch=dev.arch, device_code=dev.code, plans=dev.plans)
            return Shipped({DROPIN_FILE: text, **dev.files})
        arch = dropin_ship.current_arch("cuda") or ""
        return Shipped({DROPIN_FILE: dropin_source(problem, "cuda", candidate.extra_cflags, kernel_sha256,
                                                   built_for=built_for, root_depth=root_depth, built_arch=arch)},
                       no_device_code=dev)
    lib = dropin_ship.shipped_library(candidate)
    shipped_lib = {lib.arch: (lib.name, lib.sha256)} if lib else {}
    files = {DROPIN_FILE: dropin_source(problem, candidate.backend, candidate.extra_cflags, kernel_sha256,
                                        built_for=built_for, root_depth=root_depth, shipped=shipped_lib)}
    if lib:
        files[lib.name] = lib.text
    return Shipped(files)
