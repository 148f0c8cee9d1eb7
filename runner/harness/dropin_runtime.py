"""The drop-in's library loading, as source text (runner/harness/dropin.py puts it into every drop-in).

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

from __future__ import annotations

RUNTIME_LOAD = r'''
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
'''

DEVICE_LOAD = r'''

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


def _run_plan(inputs, outs, device):
    """The kernel's recorded steps for this call, launched through the driver on torch's current stream; KernelError
    when no plan was recorded for these shapes (the host code ran only at the verified calls)."""
    plan = _find_plan(inputs, outs)
    if plan is None:
        raise KernelError("no launch plan for these shapes (the shipped device code runs at the verified sizes)")
    drv, index = _driver_module(device)
    inputs = [t if t.data_ptr() % 256 == 0 else t.clone() for t in inputs]  # aligned as the recording's were
    ws = torch.empty(plan["workspace"], dtype=torch.uint8, device=device) if plan["workspace"] else None
    ptrs = [t.data_ptr() for t in (*inputs, *outs)]
    stream = ctypes.c_void_p(torch.cuda.current_stream(device).cuda_stream)
    drv.context(index)
    for step in plan["steps"]:
        if step["op"] == "attribute":
            drv._check(drv.lib.cuFuncSetAttribute(drv.function(index, step["kernel"]), step["attribute"],
                                                  step["value"]), "cuFuncSetAttribute")
        elif step["op"] == "memset":
            k, delta = step["slot"]
            base = ws.data_ptr() if k == -1 else ptrs[k]
            drv._check(drv.lib.cuMemsetD8Async(ctypes.c_uint64(base + delta), ctypes.c_ubyte(step["value"] & 0xFF),
                                               ctypes.c_size_t(step["bytes"]), stream), "cuMemsetD8Async")
        else:
            raw = bytearray.fromhex(step["params"])
            for off, k, delta in step["slots"]:
                struct.pack_into("<Q", raw, off, (ws.data_ptr() if k == -1 else ptrs[k]) + delta)
            buf = (ctypes.c_char * max(len(raw), 1)).from_buffer(raw) if raw else None
            size = ctypes.c_size_t(len(raw))
            extra = (ctypes.c_void_p * 5)(_PARAMS_POINTER, ctypes.cast(buf, ctypes.c_void_p) if buf else None,
                                          _PARAMS_SIZE, ctypes.cast(ctypes.pointer(size), ctypes.c_void_p),
                                          _PARAMS_END)
            fn = drv.function(index, step["kernel"])
            g, b = step["grid"], step["block"]
            if step["cooperative"] or step["cluster"] != [1, 1, 1]:
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
                rc = drv.lib.cuLaunchKernel(fn, *(ctypes.c_uint(v) for v in (*g, *b)), ctypes.c_uint(step["shmem"]),
                                            stream, None, extra)
            drv._check(rc, f"launching {step['kernel']}")
    return 0
'''
