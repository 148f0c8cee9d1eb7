"""Confinement for every process that runs code fusebot does not trust: candidates, the user's reference, compilers.

The outer wall is bubblewrap (runner.harness.bwrap): namespaces, a read-only view of only what the process needs, a
private /tmp and /dev/shm, its whole process tree killed with it. Inside it, as defence in depth, a confined process
gets, where the OS allows each:
- its own empty network namespace (no interface but a down loopback) and Landlock's TCP rules with no grant;
- Landlock filesystem rules: it may read anything but write only below its working directory (and device files);
- an audit hook that refuses Python-level sockets and writes outside the working directory (a second wall for the
  same rules, and the only one where the kernel has no Landlock);
- a non-dumpable flag, so that other processes of the same user cannot read its memory through /proc;
- an address-space limit on the CPU backend (CUDA reserves far more virtual memory than it uses, so on the GPU the
  parent's watchdog enforces the cap on resident memory instead).

`confine()` is called by the child processes first thing; `python -m runner.harness.sandbox --write DIR [--read PATH]
-- CMD...` starts CMD under bubblewrap (writes only below each DIR, reads of PATH besides the system view) and confines
it again from inside. What was achieved is returned so that a verdict can state it.
"""

from __future__ import annotations

import ctypes
import json
import logging
import os
import resource
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from pathlib import Path

from runner.harness import bwrap
from runner.harness.scrub import looks_secret, secret_name

log = logging.getLogger(__name__)

_MARK = "FUSEBOT_SANDBOX"  # set by bwrap (runner.harness.bwrap) in the sandbox's environment

_CLONE_NEWNET = 0x40000000
_PR_SET_NO_NEW_PRIVS = 38
_PR_SET_DUMPABLE = 4
_SYS_LANDLOCK_CREATE_RULESET = 444
_SYS_LANDLOCK_ADD_RULE = 445
_SYS_LANDLOCK_RESTRICT_SELF = 446
_LANDLOCK_CREATE_RULESET_VERSION = 1
_LANDLOCK_RULE_PATH_BENEATH = 1

# Landlock filesystem rights that write; reads and execution stay unrestricted.
_FS_WRITE_FILE = 1 << 1
_FS_REMOVE_DIR = 1 << 4
_FS_REMOVE_FILE = 1 << 5
_FS_MAKE_ALL = sum(1 << b for b in range(6, 13))  # char, dir, reg, sock, fifo, block, sym
_FS_REFER = 1 << 13  # ABI 2
_FS_TRUNCATE = 1 << 14  # ABI 3
_NET_BIND_TCP = 1 << 0  # ABI 4
_NET_CONNECT_TCP = 1 << 1


@dataclass(frozen=True)
class Confinement:
    netns: bool = False
    landlock_fs: bool = False
    landlock_net: bool = False
    audit_hook: bool = False
    non_dumpable: bool = False
    address_space_limit: bool = False
    bwrap: bool = False  # inside bubblewrap's namespaces (its own PID 1, no host process visible)
    unsafe_no_sandbox: bool = False  # the user opted out of bubblewrap (FUSEBOT_UNSAFE_NO_SANDBOX=1)
    user_namespace: bool = False  # its own user namespace (bwrap as root may run without one)

    def as_dict(self) -> dict[str, bool]:
        return asdict(self)


class _RulesetAttr(ctypes.Structure):
    _fields_ = [("handled_access_fs", ctypes.c_uint64), ("handled_access_net", ctypes.c_uint64)]


class _PathBeneathAttr(ctypes.Structure):
    _pack_ = 1
    _fields_ = [("allowed_access", ctypes.c_uint64), ("parent_fd", ctypes.c_int32)]


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def _landlock(write_dirs: list[Path]) -> tuple[bool, bool]:
    libc = _libc()
    libc.syscall.restype = ctypes.c_long
    abi = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, None, ctypes.c_size_t(0), _LANDLOCK_CREATE_RULESET_VERSION)
    if abi < 1:
        return False, False
    fs = _FS_WRITE_FILE | _FS_REMOVE_DIR | _FS_REMOVE_FILE | _FS_MAKE_ALL
    if abi >= 2:
        fs |= _FS_REFER
    if abi >= 3:
        fs |= _FS_TRUNCATE
    net = (_NET_BIND_TCP | _NET_CONNECT_TCP) if abi >= 4 else 0
    attr = _RulesetAttr(fs, net)
    size = ctypes.sizeof(_RulesetAttr) if net else 8
    ruleset = libc.syscall(_SYS_LANDLOCK_CREATE_RULESET, ctypes.byref(attr), ctypes.c_size_t(size), 0)
    if ruleset < 0:
        return False, False
    try:
        # Device files, and the process's own /proc/<pid> (the CUDA driver writes there at initialisation; measured
        # on the H100: without it cudaGetDeviceCount fails with error 304). Nothing else outside the working dirs.
        files_only = _FS_WRITE_FILE | (fs & _FS_TRUNCATE)
        grants = [(d, fs) for d in write_dirs] + [(Path("/dev"), files_only), (Path("/proc/self"), files_only)]
        for path, rights in grants:
            try:
                fd = os.open(path, os.O_PATH | os.O_CLOEXEC)
            except OSError:
                continue
            try:
                rule = _PathBeneathAttr(rights, fd)
                if libc.syscall(_SYS_LANDLOCK_ADD_RULE, ruleset, _LANDLOCK_RULE_PATH_BENEATH, ctypes.byref(rule), 0):
                    raise OSError(ctypes.get_errno(), f"landlock_add_rule({path})")
            finally:
                os.close(fd)
        if libc.prctl(_PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0:
            return False, False
        if libc.syscall(_SYS_LANDLOCK_RESTRICT_SELF, ruleset, 0) != 0:
            return False, False
    finally:
        os.close(ruleset)
    return True, bool(net)


def _audit_hook(write_dirs: list[str]):
    roots = tuple(os.path.realpath(d) + os.sep for d in write_dirs) + ("/dev/",)

    def hook(event: str, args: tuple) -> None:
        if event == "socket.connect" or event == "socket.bind" or event == "socket.getaddrinfo":
            raise PermissionError(f"fusebot sandbox: network access refused ({event})")
        if event == "open" and len(args) >= 2:
            path, mode = args[0], args[1]
            writes = isinstance(mode, str) and any(c in mode for c in "wax+")
            if isinstance(mode, int):
                writes = bool(mode & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND))
            if writes and isinstance(path, str | bytes | os.PathLike):
                real = os.path.realpath(os.fsdecode(path)) + os.sep
                if not real.startswith(roots):
                    raise PermissionError(f"fusebot sandbox: write outside the working directory refused: {path}")

    return hook


def confine(workdir: Path, *, extra_write: list[Path] = (), address_space_bytes: int | None = None) -> Confinement:
    """Confine the calling process (irreversibly). Call before importing untrusted code."""
    libc = _libc()
    netns = libc.unshare(_CLONE_NEWNET) == 0
    non_dumpable = libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    write_dirs = [Path(workdir).resolve(), *[Path(p).resolve() for p in extra_write]]
    try:
        landlock_fs, landlock_net = _landlock(write_dirs)
    except OSError as exc:
        log.warning("landlock unavailable: %s", exc)
        landlock_fs = landlock_net = False
    sys.addaudithook(_audit_hook([str(d) for d in write_dirs]))
    limited = False
    if address_space_bytes:
        resource.setrlimit(resource.RLIMIT_AS, (address_space_bytes, address_space_bytes))
        limited = True
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
    return Confinement(netns, landlock_fs, landlock_net, True, non_dumpable, limited, inside_bwrap(),
                       os.environ.get(bwrap.UNSAFE_ENV) == "1", own_user_namespace())


def own_user_namespace() -> bool:
    """False in the initial user namespace (its uid map is the identity over the whole range)."""
    try:
        return Path("/proc/self/uid_map").read_text().split() != ["0", "0", "4294967295"]
    except OSError:
        return False


def inside_bwrap() -> bool:
    """True in a process that bubblewrap started: PID 1 of its PID namespace is bwrap (no host process is)."""
    try:
        return os.environ.get(_MARK) == "bwrap" and Path("/proc/1/comm").read_text().strip() == "bwrap"
    except OSError:
        return False


_KEPT_FUSEBOT = (bwrap.UNSAFE_ENV, "FUSEBOT_DROPIN_CACHE")


def secret_variable(name: str, value: str) -> bool:
    """Whether an environment variable must not travel into a sandbox: a name that says credential (*TOKEN*, *KEY*,
    *SECRET*, ...), any of fusebot's own settings (FUSEBOT_*: the bot's and the LLM's keys live there), the CI's
    runtime variables (GITHUB_*, ACTIONS_*), or a value that looks like a credential whatever its name."""
    upper = name.upper()
    if upper.startswith("FUSEBOT_"):
        return upper not in _KEPT_FUSEBOT
    if upper.startswith(("GITHUB_", "ACTIONS_", "RUNNER_", "AWS_", "GOOGLE_", "AZURE_")):
        return True
    return secret_name(name) or looks_secret(value)


def confined_env(workdir: Path, base: dict[str, str] | None = None) -> dict[str, str]:
    """Environment for a confined process: every cache and temporary path points into its working directory."""
    env = {k: v for k, v in (os.environ if base is None else base).items() if not secret_variable(k, v)}
    wd = str(workdir)
    # Children import the same fusebot as the parent (not whichever one is installed for their directory).
    here = str(Path(__file__).resolve().parents[2])
    env["PYTHONPATH"] = os.pathsep.join([here, *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    env.update(
        HOME=wd,
        TMPDIR=wd,
        PYTHONDONTWRITEBYTECODE="1",
        PYTHONUNBUFFERED="1",
        CUDA_CACHE_PATH=os.path.join(wd, ".nv"),
        TRITON_CACHE_DIR=os.path.join(wd, ".triton"),
        TORCH_EXTENSIONS_DIR=os.path.join(wd, "torch_extensions"),
    )
    # always its own: torch writes its default (under the parent's /tmp) into os.environ once it has used it
    env["TORCHINDUCTOR_CACHE_DIR"] = os.path.join(wd, "inductor")
    return env


def describe_problem(spec, module: str, output: str, what: str, timeout_s: float) -> object | None:
    """Run `python -m MODULE SPEC.json` (a describer of ours that loads the user's problem) confined, with no GPU,
    and read the JSON it writes as `output` beside the spec; None (and a logged reason) when it cannot."""
    with tempfile.TemporaryDirectory(prefix="fusebot-describe-") as tmp:
        work = Path(tmp)
        (work / "spec.json").write_text(spec.model_dump_json())
        env = confined_env(work)
        env["CUDA_VISIBLE_DEVICES"] = ""
        where = spec.root or (str(Path(spec.path).parent) if spec.path else None)
        cmd = [sys.executable, "-m", "runner.harness.sandbox", "--write", str(work),
               *(["--read", where] if where else []), "--", sys.executable, "-m", module, str(work / "spec.json")]
        try:
            proc = subprocess.run(cmd, cwd=work, env=env, capture_output=True, text=True, timeout=timeout_s)
        except subprocess.TimeoutExpired:
            log.warning("describing %s's %s timed out after %.0f s", spec.name, what, timeout_s)
            return None
        out = work / output
        if not out.exists():
            log.warning("could not describe %s's %s: %s", spec.name, what, (proc.stdout + proc.stderr).strip()[-600:])
            return None
        return json.loads(out.read_text())


_USAGE = "usage: python -m runner.harness.sandbox --write DIR [--write DIR] [--read PATH] [--memory BYTES] -- CMD ..."


def main(argv: list[str]) -> int:
    """python -m runner.harness.sandbox --write DIR [--write DIR ...] [--read PATH ...] [--memory BYTES] -- CMD ARGS...

    Outside bubblewrap: re-executes itself under bwrap (DIRs writable, PATHs readable, working directory the first
    DIR). Inside (or where the user opted out): confines this process in-process (an address-space limit of BYTES,
    which CMD and its children inherit: a compiler fed `#include "/dev/zero"` fails at it), then execs CMD."""
    if "--" not in argv:
        print(_USAGE, file=sys.stderr)  # noqa: T201
        return 2
    split = argv.index("--")
    opts, cmd = argv[:split], argv[split + 1 :]
    dirs = [Path(opts[i + 1]) for i, a in enumerate(opts[:-1]) if a == "--write"]
    reads = [Path(opts[i + 1]) for i, a in enumerate(opts[:-1]) if a == "--read"]
    memory = [int(opts[i + 1]) for i, a in enumerate(opts[:-1]) if a == "--memory"]
    if not dirs or not cmd:
        print(_USAGE, file=sys.stderr)  # noqa: T201
        return 2
    if os.environ.get(_MARK) != "bwrap":
        # the caller logs the opt-out's warning; here it would land in the confined command's own output
        logging.getLogger(bwrap.__name__).disabled = True
        try:
            mode = bwrap.require()
        except bwrap.SandboxUnavailable as exc:
            print(f"fusebot sandbox: {exc}", file=sys.stderr)  # noqa: T201
            return 126
        if mode.bwrap is not None:
            outer = bwrap.wrap([sys.executable, "-m", "runner.harness.sandbox", *opts, "--", *cmd], dirs[0],
                               write=dirs[1:], read=reads)
            os.execvp(outer[0], outer)
    confine(dirs[0], extra_write=dirs[1:], address_space_bytes=memory[-1] if memory else None)
    os.execvp(cmd[0], cmd)
    return 127  # not reached


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
