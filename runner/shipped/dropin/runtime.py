"""The drop-in's library loading (a part of every drop-in).

Order of preference, each step refusing what does not fit and saying why once:
1. the library the runner shipped beside the drop-in (`kernel.<arch>.so.b64`: zlib-compressed, base64), chosen by
   this host's arch (CUDA: the GPU's compute capability, its SASS or its PTX; CPU: the x86-64 level or the machine),
   its sha256 checked against the one recorded in the drop-in, loaded from memory (memfd) so nothing is written;
2. a build from source when a compiler is present (g++, or nvcc for CUDA), into a per-user cache created 0700 and
   keyed by the sources, flags, compiler version and this host's CPU or GPU arch;
3. otherwise BuildError saying what is needed; the forward then calls the original module (one warning).

Names it defines that other code relies on: `BuildError`, `_bind(path)` and `_LIB` (the harness binds the library it
built and timed: runner/harness/procs/contestant.py), `_compile`, `_intact`, `_cpu_model` (tests).
"""

import base64
import ctypes
import hashlib
import logging
import os
import shutil
import stat
import subprocess
import threading
import zlib
from pathlib import Path

import torch

from runner.shipped.dropin.head import _HERE, BACKEND, BUILT_ARCH, BUILT_FOR, FLAGS, KERNEL, SHIPPED


def _note(key, message, warn=True):
    """The guard's (a later part of the drop-in)."""
    from runner.shipped.dropin.guard import _note as note  # the guard imports this part: bound at the call
    return note(key, message, warn)

# ---- the drop-in from here on

log = logging.getLogger(__name__)


class BuildError(RuntimeError):
    """The kernel cannot be loaded or built on this machine; the message says why and what to do."""


class _FbTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("dtype", ctypes.c_int32), ("ndim", ctypes.c_int32),
                ("shape", ctypes.c_int64 * 8), ("strides", ctypes.c_int64 * 8)]


_LOCK = threading.RLock()
_LIB = None  # a library bound from outside (the harness), used for every device
_LIBS = {}  # arch -> bound library, or the BuildError that says why there is none
_BY_DEVICE = {}  # torch.device -> the same (the arch looked up once per device)
_FDS = []  # the memfds shipped libraries were loaded from


def _cpu_flags():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith(("flags", "Features")):
                return set(line.split(":", 1)[1].split())
    except OSError:
        pass
    return set()


_X86_LEVELS = (("x86-64-v4", {"avx512f", "avx512bw", "avx512cd", "avx512dq", "avx512vl"}),
               ("x86-64-v3", {"avx", "avx2", "bmi1", "bmi2", "f16c", "fma", "abm", "movbe", "xsave"}),
               ("x86-64-v2", {"cx16", "lahf_lm", "popcnt", "sse4_1", "sse4_2", "ssse3"}))


def _host_arch(device=None):
    """This host's arch as the shipped libraries name it: "sm_90" for a CUDA device, "x86-64-v3" (the highest x86-64
    level every lower one of which the CPU has), or the machine ("aarch64")."""
    if BACKEND == "cuda":
        major, minor = torch.cuda.get_device_capability(device)
        return f"sm_{major}{minor}"
    machine = os.uname().machine
    if machine not in ("x86_64", "AMD64"):
        return machine
    have, level = _cpu_flags(), "x86-64"
    for name, need in reversed(_X86_LEVELS):
        if not need <= have:
            break
        level = name
    return level


def _rank(arch):
    """An arch's place in its order: a CUDA compute capability, or an x86-64 level; None for another machine."""
    if arch.startswith("sm_"):
        return int("".join(c for c in arch[3:] if c.isdigit()) or 0)
    order = ["x86-64", *[n for n, _ in reversed(_X86_LEVELS)]]
    return order.index(arch) if arch in order else None


def _fits(shipped, host):
    """Whether a library built for `shipped` runs here: CUDA, a capability up to this GPU's (SASS, or its PTX compiled
    by the driver); CPU, an x86-64 level up to this CPU's, or the same machine."""
    a, b = _rank(shipped), _rank(host)
    if a is None or b is None:
        return shipped == host
    return shipped.startswith("sm_") == host.startswith("sm_") and a <= b


def _shipped(host):
    """The shipped library's bytes for this host after its sha256 checked, or None; why not is logged once."""
    fitting = sorted((a for a in SHIPPED if _fits(a, host)), key=lambda a: _rank(a) or 0, reverse=True)
    if not fitting:
        if SHIPPED:
            _note(f"ship:{host}", f"the shipped kernel libraries ({', '.join(sorted(SHIPPED))}) do not run on this "
                  f"host ({host})", warn=False)
        return None
    arch = fitting[0]
    name, digest = SHIPPED[arch]
    try:
        text = (_HERE / name).read_text()
        data = zlib.decompress(base64.b64decode("".join(ln for ln in text.splitlines() if not ln.startswith("#"))))
    except (OSError, ValueError, zlib.error) as exc:
        _note(f"ship:{name}", f"the shipped kernel library {name} cannot be read ({exc}); not used")
        return None
    if hashlib.sha256(data).hexdigest() != digest:
        _note(f"ship:{name}", f"the shipped kernel library {name} does not have the sha256 recorded in this drop-in "
              "(altered or replaced); it is not loaded")
        return None
    return data


def _load_bytes(data):
    """dlopen a library from memory (a sealed memfd): nothing written to disk. Elsewhere: the per-user cache."""
    if hasattr(os, "memfd_create") and Path("/proc/self/fd").is_dir():
        fd = os.memfd_create("fusebot-" + KERNEL, os.MFD_CLOEXEC | getattr(os, "MFD_ALLOW_SEALING", 0))
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            try:
                import fcntl  # sealing: the bytes checked are the bytes mapped
                fcntl.fcntl(fd, fcntl.F_ADD_SEALS, fcntl.F_SEAL_WRITE | fcntl.F_SEAL_GROW | fcntl.F_SEAL_SHRINK
                            | fcntl.F_SEAL_SEAL)
            except (ImportError, AttributeError, OSError):
                pass
            lib = _bind(f"/proc/self/fd/{fd}")
        except BaseException:
            os.close(fd)
            raise
        _FDS.append(fd)  # kept open: the loader knows a library by its path, and a closed fd's number comes back
        return lib
    lib = _cache_root() / hashlib.sha256(data).hexdigest() / "kernel.so"
    if not _intact(lib):
        _store(lib, data)
    return _bind(lib)


def _nvcc():
    home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    return shutil.which("nvcc") or (home and shutil.which("nvcc", path=str(Path(home) / "bin"))) or None


def _compile(device=None):
    """Build the kernel from source once per (sources, flags, compiler, host arch) into the per-user cache; return the
    library's path. BuildError when this host has no compiler or the build fails."""
    flags = list(FLAGS)
    if BACKEND == "cuda":
        if not torch.cuda.is_available():
            raise BuildError(f"{KERNEL} is a CUDA kernel and torch sees no CUDA GPU here")
        arch = _host_arch(device)
        if BUILT_ARCH and arch != BUILT_ARCH:
            test = next(iter(sorted(p.name for p in _HERE.glob("test_*.py"))), "the test beside this drop-in")
            log.warning("fusebot drop-in: building %s for %s (%s); it was verified on %s (%s): run %s on this "
                        "machine before relying on it", KERNEL, arch, torch.cuda.get_device_name(device), BUILT_FOR,
                        BUILT_ARCH, test)
        flags.append(f"-gencode=arch=compute_{arch[3:]},code={arch}")
        compiler = _nvcc()
        if not compiler:
            raise BuildError(f"no shipped library runs on this GPU ({arch}) and nvcc was not found (PATH, "
                             f"CUDA_HOME): install the CUDA toolkit to build {KERNEL} here")
    else:
        arch = _host_arch() + " " + _cpu_model()  # FLAGS build for this CPU (-march=native): its model is in the key
        compiler = shutil.which(os.environ.get("CXX", "g++"))
        if not compiler:
            raise BuildError(f"no shipped library runs on this CPU and no C++ compiler "
                             f"({os.environ.get('CXX', 'g++')}) is on PATH: install g++ (or set CXX) to build {KERNEL}")
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True, check=True).stdout
    h = hashlib.sha256()
    for part in ((_HERE / KERNEL).read_bytes(), (_HERE / "fusebot.h").read_bytes(), " ".join(flags).encode(),
                 version.encode(), arch.encode(), os.uname().machine.encode()):
        h.update(part + b"\0")
    lib = _cache_root() / h.hexdigest() / "kernel.so"
    if not _intact(lib):
        lib.parent.mkdir(mode=0o700, exist_ok=True)
        tmp = lib.parent / f".kernel.{os.getpid()}.{threading.get_ident()}.so"
        cmd = [compiler, *flags, "-I", str(_HERE), "-o", str(tmp), str(_HERE / KERNEL)]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise BuildError(f"building {KERNEL} for {arch} failed:\n{done.stdout}{done.stderr}")
        data = tmp.read_bytes()
        tmp.unlink()
        _store(lib, data)
    return lib


def _store(lib, data):
    lib.parent.mkdir(mode=0o700, exist_ok=True)
    tag = f"{os.getpid()}.{threading.get_ident()}"
    tmp, rec = lib.parent / f".kernel.{tag}.so", lib.parent / f".sha256.{tag}"
    tmp.write_bytes(data)
    rec.write_text(hashlib.sha256(data).hexdigest())
    os.replace(rec, lib.parent / "kernel.so.sha256")
    os.replace(tmp, lib)
    if not _intact(lib):
        raise BuildError(f"the kernel library at {lib} changed before it was loaded")


def _cpu_model():
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line + " " + " ".join(sorted(_cpu_flags()))
    except OSError:
        pass
    return " ".join(sorted(_cpu_flags()))


def _private(path):
    """Whether `path` is a real directory or file of this user that nobody else may write to."""
    st = os.lstat(path)
    return not stat.S_ISLNK(st.st_mode) and st.st_uid == os.getuid() and not st.st_mode & 0o022


def _cache_root():
    """The per-user build cache: $FUSEBOT_DROPIN_CACHE, else $XDG_CACHE_HOME/fusebot/dropin (~/.cache/...), created
    0700; refused when another user owns it or others may write to it (they could plant a library run here)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    root = Path(os.environ.get("FUSEBOT_DROPIN_CACHE") or Path(base) / "fusebot" / "dropin")
    try:
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
    except OSError as exc:
        raise BuildError(f"the kernel cache {root} cannot be created ({exc}): set FUSEBOT_DROPIN_CACHE") from None
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
    """The kernel library at `path`, its entry points typed (the optional ones None where not exported)."""
    lib = ctypes.CDLL(str(path))
    lib.fusebot_forward.restype = ctypes.c_int
    lib.fusebot_forward.argtypes = [ctypes.POINTER(_FbTensor), ctypes.c_int32, ctypes.POINTER(_FbTensor),
                                    ctypes.c_int32, ctypes.c_void_p]
    for name, restype, argtypes in (("fusebot_last_error", ctypes.c_char_p, []),
                                    ("fusebot_set_workspace", None, [ctypes.c_void_p, ctypes.c_size_t]),
                                    ("fusebot_workspace_need", ctypes.c_size_t, [])):
        fn = getattr(lib, name, None)
        if fn is not None:
            fn.restype, fn.argtypes = restype, argtypes
        setattr(lib, "fb_" + name.removeprefix("fusebot_"), fn)
    return lib


def _library(device):
    """The bound library for `device`'s arch: shipped, else built here; BuildError (remembered) when neither."""
    if _LIB is not None:
        return _LIB
    lib = _BY_DEVICE.get(device)
    if lib is None:
        with _LOCK:
            arch = _host_arch(device)
            lib = _LIBS.get(arch)
            if lib is None:
                try:
                    data, lib = _shipped(arch), None
                    if data is not None:
                        try:
                            lib = _load_bytes(data)
                        except OSError as exc:  # e.g. a library the loader refuses: try a build from source
                            _note(f"load:{arch}", f"the shipped kernel library does not load here ({exc})")
                    if lib is None:
                        lib = _bind(_compile(device))
                except BuildError as exc:
                    lib = exc
                except (OSError, subprocess.SubprocessError) as exc:
                    lib = BuildError(f"the kernel library cannot be loaded or built here: {exc}")
                _LIBS[arch] = lib
            _BY_DEVICE[device] = lib
    if isinstance(lib, BuildError):
        raise lib
    return lib
