"""Running an untrusted command under bubblewrap (`bwrap`): the outer wall of fusebot's confinement.

Every process that runs code fusebot does not trust (a candidate, the judge that runs the user's reference, a
compiler, a capture, a drop-in's generated test) starts as `bwrap ... -- CMD`, with:
- new user, PID, mount, network, IPC, UTS and cgroup namespaces (`--unshare-all`), no capability, no further user
  namespace: it sees and can signal only its own processes, has no network and no pathname UNIX socket of the host;
- a read-only view of only what it needs: /usr (the toolchain), the dynamic loader's configuration, the Python
  installation and site-packages, fusebot's own `runner` package, the CUDA toolkit and driver libraries, and the GPU
  device nodes where present; its own working directory (and any extra directory its caller grants) read-write;
- its own /proc, a minimal /dev, and a private /tmp and /dev/shm (tmpfs, each capped in size);
- `--die-with-parent` and `--new-session`: when the evaluation ends (its parent kills bwrap, or dies) the sandbox's
  PID 1 dies and the kernel kills every process of the namespace, setsid daemons and double-forked orphans included.
  The kernel's "parent" there is the *thread* that started bwrap: `popen` starts every sandbox from one thread that
  lives as long as this process, never from the short-lived threads a search runs steps on.

Where bwrap is missing or cannot create namespaces, `require()` raises SandboxUnavailable naming the fix, unless the
user opts out with FUSEBOT_UNSAFE_NO_SANDBOX=1 (then only the in-process layer of runner.harness.sandbox applies).
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import functools
import glob
import logging
import os
import shutil
import signal
import site
import subprocess
import sys
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from runner.errors import MachineError, UsageError

log = logging.getLogger(__name__)

UNSAFE_ENV = "FUSEBOT_UNSAFE_NO_SANDBOX"
TMPFS_DEFAULT_BYTES = 4 << 30
RUNNER_PACKAGE = Path(__file__).resolve().parents[1]  # .../runner
FIX = ("install bubblewrap (Debian/Ubuntu: `apt-get install bubblewrap`) and allow unprivileged user namespaces "
       "(sysctl kernel.unprivileged_userns_clone=1, or on Ubuntu 24.04 kernel.apparmor_restrict_unprivileged_userns"
       f"=0), or run as root; or set {UNSAFE_ENV}=1 to evaluate untrusted code without the sandbox, at your own risk")
# The dynamic loader's and the C library's configuration: nothing else of /etc is visible.
_ETC = ("ld.so.cache", "ld.so.conf", "ld.so.conf.d", "alternatives", "passwd", "group", "nsswitch.conf", "localtime")


class SandboxUnavailable(MachineError):
    """bubblewrap is missing here or cannot create its namespaces: fusebot will not run untrusted code unconfined."""


@dataclass(frozen=True)
class SandboxMode:
    """How untrusted processes are confined on this machine (recorded in every verdict's environment.sandbox)."""

    bwrap: str | None  # the bwrap executable; None when the user opted out
    user_namespace: bool = False
    unsafe: bool = False


def unsafe_opt_out(environ: dict[str, str] | None = None) -> bool:
    """FUSEBOT_UNSAFE_NO_SANDBOX: unset, "" or "0" (the default: confine), or "1" (opt out). Anything else is a
    usage error, so that a typo never silently turns the sandbox off (or on)."""
    raw = (os.environ if environ is None else environ).get(UNSAFE_ENV, "").strip()
    if raw in ("", "0"):
        return False
    if raw == "1":
        return True
    raise UsageError(f"{UNSAFE_ENV} must be 1 (evaluate untrusted code without a sandbox) or 0, not {raw!r}")


def require() -> SandboxMode:
    """The sandbox this process will use; raises SandboxUnavailable (naming the fix) where there is none and the
    user did not opt out. Cheap after the first call: call it at start-up, and before every untrusted process."""
    return _mode(unsafe_opt_out())


@functools.cache
def _mode(unsafe: bool) -> SandboxMode:
    if unsafe:
        log.warning("%s=1: untrusted code runs WITHOUT the bubblewrap sandbox (only the in-process Landlock and audit "
                    "hook confine it); the verdicts say so", UNSAFE_ENV)
        return SandboxMode(bwrap=None, unsafe=True)
    exe = shutil.which("bwrap")
    if exe is None:
        raise SandboxUnavailable(f"bubblewrap (bwrap) is not on PATH: {FIX}")
    probe = [exe, *base_args(Path("/"), user_namespace=False, tmpfs_bytes=1 << 20), "--", "cat", "/proc/self/uid_map"]
    try:
        done = subprocess.run(probe, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise SandboxUnavailable(f"bwrap ({exe}) did not run: {exc}: {FIX}") from None
    if done.returncode != 0:
        raise SandboxUnavailable(f"bwrap ({exe}) cannot create its namespaces here: {done.stderr.strip()[:300]}: "
                                 f"{FIX}")
    # An identity map of the whole uid range is the initial user namespace: bwrap ran (as root) without a new one.
    userns = done.stdout.split() != ["0", "0", "4294967295"]
    if not userns:
        log.warning("bwrap runs without a user namespace here (allowed for root): the other namespaces still apply")
    return SandboxMode(bwrap=exe, user_namespace=userns)


def _ro(path: str | Path) -> list[str]:
    return ["--ro-bind", str(path), str(path)] if os.path.exists(path) else []


def _system_view() -> list[str]:
    args: list[str] = []
    for top in ("usr", "bin", "sbin", "lib", "lib32", "lib64", "libx32"):
        p = Path("/") / top
        if p.is_symlink():
            args += ["--symlink", os.readlink(p), str(p)]
        elif p.exists():
            args += _ro(p)
    for name in _ETC:
        args += _ro(Path("/etc") / name)
    args += _ro("/sys")  # device and CPU topology (the CUDA driver and torch's cpuinfo read it)
    return args


def _outside_usr(paths: Iterable[str | Path]) -> list[str]:
    """Existing paths not already visible through /usr, deduplicated, parents before children."""
    seen: list[str] = []
    for p in paths:
        if not p:
            continue
        real = os.path.realpath(p)
        if os.path.exists(real) and not real.startswith("/usr/") and real not in seen and real != "/":
            seen.append(real)
    seen.sort(key=lambda s: (s.count("/"), s))
    return [s for i, s in enumerate(seen) if not any(s.startswith(o + "/") for o in seen[:i])]


def _python_view() -> list[str]:
    # The installation (stdlib, the interpreter) and the environment's site-packages; not the current directory,
    # not the repository fusebot runs from (only its `runner` package, below).
    paths = [sys.prefix, sys.base_prefix, sys.exec_prefix, os.path.dirname(os.path.realpath(sys.executable)),
             *site.getsitepackages()]
    paths += [p for p in sys.path if "site-packages" in p or "dist-packages" in p]
    out: list[str] = []
    for p in _outside_usr(paths):
        out += _ro(p)
    if os.path.dirname(sys.executable) != os.path.dirname(os.path.realpath(sys.executable)):
        out += _ro(os.path.dirname(sys.executable))  # a venv's bin/ with its python symlink
    return [*out, *_ro(RUNNER_PACKAGE)]


@functools.cache
def _driver_dirs() -> tuple[str, ...]:
    """Where the CUDA driver's user-space libraries live (the loaded libcuda's folder, as ldconfig knows it)."""
    dirs = []
    try:
        out = subprocess.run(["ldconfig", "-p"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.TimeoutExpired):
        out = ""
    for line in out.splitlines():
        name, _, target = line.strip().partition(" => ")
        if name.startswith(("libcuda.so", "libnvidia-", "libnvcuvid", "libcudadebugger")):
            dirs.append(os.path.dirname(target))
    return tuple(dirs)


def _cuda_view() -> list[str]:
    toolkits = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda", "/opt/cuda"]
    libdirs = [d for d in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if d]
    args: list[str] = []
    for p in _outside_usr([*toolkits, *glob.glob("/usr/local/cuda-*"), *_driver_dirs(), *libdirs]):
        args += _ro(p)
    for link in toolkits:  # /opt/cuda -> /opt/cuda-12.4: the link too, where /usr does not already hold it
        if link and os.path.islink(link) and not link.startswith("/usr/"):
            args += ["--symlink", os.readlink(link), link]
    return args


def _toolchain_view() -> list[str]:
    """The host's compilers where they live outside /usr (a GPU image's /opt/gcc, say): the prefix above each one's
    bin/, so that nvcc's host compiler and torch.compile's C++ compiler run inside the sandbox as outside."""
    names = ("gcc", "g++", "cc", "c++", "nvcc", os.environ.get("CC", ""), os.environ.get("CXX", ""))
    prefixes = []
    for name in names:
        exe = shutil.which(name) if name else None
        if exe:
            real = os.path.realpath(exe)
            prefixes += [os.path.dirname(os.path.dirname(real)), os.path.dirname(os.path.dirname(exe))]
    args: list[str] = []
    for p in _outside_usr(q for q in prefixes if os.path.realpath(q) != "/usr"):
        args += _ro(p)
    return args


def _gpu_devices() -> list[str]:
    args: list[str] = []
    for dev in sorted(glob.glob("/dev/nvidia*")):  # nvidia0.., nvidiactl, nvidia-uvm(-tools), nvidia-modeset, -caps
        args += ["--dev-bind", dev, dev]
    return args


def base_args(workdir: Path, *, user_namespace: bool, tmpfs_bytes: int = TMPFS_DEFAULT_BYTES,
              write: Sequence[str | Path] = (), read: Sequence[str | Path] = ()) -> list[str]:
    """bwrap's options (everything before `--`) for a command working in `workdir`."""
    args = ["--unshare-all", "--die-with-parent", "--new-session", "--cap-drop", "ALL", "--hostname", "fusebot",
            "--setenv", "FUSEBOT_SANDBOX", "bwrap"]
    if user_namespace:
        args += ["--unshare-user", "--disable-userns"]
    # The private /tmp and /dev/shm first: the views bound after them may lie below /tmp (a checkout or a virtualenv
    # there), and a tmpfs mounted later would hide them.
    size = str(int(tmpfs_bytes))
    args += ["--proc", "/proc", "--dev", "/dev", *_gpu_devices()]
    args += ["--size", size, "--tmpfs", "/tmp", "--size", size, "--tmpfs", "/dev/shm"]
    args += _system_view() + _python_view() + _cuda_view() + _toolchain_view()
    for p in dict.fromkeys(os.path.realpath(r) for r in read):
        args += _ro(p)
    wd = os.path.realpath(workdir)
    for p in dict.fromkeys([*(os.path.realpath(w) for w in write), wd] if wd != "/" else []):
        os.makedirs(p, exist_ok=True)
        args += ["--bind", p, p]
    args += ["--chdir", wd]
    return args


def wrap(cmd: Sequence[str], workdir: Path, *, write: Sequence[str | Path] = (), read: Sequence[str | Path] = (),
         tmpfs_bytes: int = TMPFS_DEFAULT_BYTES) -> list[str]:
    """The command line that runs `cmd` confined (or `cmd` itself where the user opted out of the sandbox)."""
    mode = require()
    if mode.bwrap is None:
        return list(cmd)
    return [mode.bwrap, *base_args(Path(workdir), user_namespace=mode.user_namespace, tmpfs_bytes=tmpfs_bytes,
                                   write=write, read=read), "--", *cmd]


# One thread starts every sandbox, and lives until this process exits. bwrap's --die-with-parent is the parent-death
# signal (prctl PR_SET_PDEATHSIG), which fires when the thread that forked bwrap ends: a candidate process prestarted
# from a search chunk's evaluation thread was SIGKILLed as that chunk ended, and the next candidate (or the
# finalist's confirmation) that took it "died during 'init' (SIGKILL)". On an H200, all three real-world targets
# of a demo were declined that way.
_PARENT = concurrent.futures.ThreadPoolExecutor(max_workers=1, thread_name_prefix="fusebot-sandbox-parent")


def popen(cmd: Sequence[str], **kwargs) -> subprocess.Popen:
    """`subprocess.Popen(cmd, **kwargs)` from the thread that starts every sandbox (`_PARENT`)."""
    return _PARENT.submit(subprocess.Popen, list(cmd), **kwargs).result()


def tree(pid: int) -> list[psutil.Process]:
    """Process `pid` and its descendants (under bwrap: every process of the sandbox)."""
    try:
        root = psutil.Process(pid)
        return [root, *root.children(recursive=True)]
    except psutil.Error:
        return []


def kill_tree(pid: int | None, *, also: Sequence[psutil.Process] = (), wait_s: float = 5.0) -> None:
    """SIGKILL process `pid` (bwrap, or the command itself where the user opted out; a child not yet reaped, so that
    its PID is still its own), its process group, every descendant and `also` (a tree taken earlier: psutil checks
    that each is still the same process), and wait until they are gone: when this returns, nothing of the sandbox
    runs any more."""
    procs = [*(tree(pid) if pid is not None else []), *also]
    if pid is not None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, signal.SIGKILL)
    for p in procs:
        with contextlib.suppress(psutil.Error):
            p.kill()
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline and any(_running(p) for p in procs):
        time.sleep(0.005)


def _running(p: psutil.Process) -> bool:
    """Alive and not a zombie (a zombie runs nothing; its reaper, not us, removes it)."""
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def description(mode: SandboxMode) -> dict[str, bool]:
    """What a verdict records of the outer sandbox (see runner.harness.sandbox.Confinement)."""
    return {"bwrap": mode.bwrap is not None, "user_namespace": mode.user_namespace, "unsafe_no_sandbox": mode.unsafe}
