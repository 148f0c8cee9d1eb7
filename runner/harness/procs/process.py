"""A child process the harness talks to: JSON lines over two private pipes, with a timeout and a memory cap, run
under bubblewrap (runner.harness.bwrap): its whole process tree dies when it is killed or closed.

The parent never unpickles anything a child sends (a candidate could make pickle run code in the parent): requests
and replies are JSON; bulk tensors travel as raw files in the child's working directory. The child's stdout and
stderr go to a log file, so nothing a candidate prints can be taken for a reply.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import select
import signal
import stat
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import psutil

from runner.harness import bwrap
from runner.harness.scrub import scrub

log = logging.getLogger(__name__)

class ChildDied(Exception):
    """The child exited, was killed, or stopped answering. `kind` is 'crash', 'timeout' or 'memory'."""

    def __init__(self, kind: str, message: str, log_tail: str = ""):
        super().__init__(message)
        self.kind = kind
        self.log_tail = log_tail


@dataclass
class Limits:
    memory_bytes: int = 32 << 30  # PSS of the child's processes, its private tmpfs files and its directory's files
    poll_seconds: float = 0.05
    tmpfs_bytes: int | None = None  # size of each of its private /tmp and /dev/shm; None: memory_bytes
    reply_bytes: int = 16 << 20  # the longest reply line read (the largest honest one, 20,000 fingerprints, is ~2 MB)


# Caches a child may be pointed at outside its own directory (torch.compile's, say): granted read-write.
_CACHE_VARIABLES = ("TORCHINDUCTOR_CACHE_DIR", "TORCH_EXTENSIONS_DIR", "TRITON_CACHE_DIR", "CUDA_CACHE_PATH")
_JUDGE = "runner.harness.procs.judge"


def _default_read(module: str, workdir: Path) -> list[Path]:
    # The judge reads each candidate's output files from the candidate's directory, a sibling of its own.
    return [Path(workdir).parent] if module == _JUDGE else []


def read_tail(source: int | str | Path, n_bytes: int) -> str:
    """At most the last `n_bytes` of a regular file, never blocking and never following a symlink: a FIFO, a device,
    a symlink or a directory reads as "", a 2 GiB sparse file costs one `n_bytes` read. `source` is an open
    descriptor (read with pread, its offset untouched) or a path (opened O_NOFOLLOW | O_NONBLOCK)."""
    own = not isinstance(source, int)
    try:
        fd = os.open(source, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC) if own else source
    except OSError:
        return ""
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode) or n_bytes <= 0:
            return ""
        start = max(0, st.st_size - n_bytes)
        return os.pread(fd, min(n_bytes, st.st_size), start).decode(errors="replace")
    except OSError:
        return ""
    finally:
        if own:
            os.close(fd)


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Child:
    """`Child(module, workdir, env)` runs `python -m module` under bubblewrap with a request pipe and a reply pipe.

    The process starts with the first request (its `init`), whose paths it is granted: `extra_write` read-write, the
    `library` and the problem's file or root read-only, besides `read` and `write` given here. The judge (which reads
    the candidates' output files) also reads its working directory's parent."""

    def __init__(self, module: str, workdir: Path, env: dict[str, str], limits: Limits | None = None, *,
                 read: Sequence[str | Path] | None = None, write: Sequence[str | Path] = ()):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.mode = bwrap.require()  # SandboxUnavailable (naming the fix) before anything untrusted starts
        self.module = module
        self.log_path = self.workdir / "child.log"
        # The parent keeps its own descriptor of the log: whatever the candidate later puts at this path (a FIFO, a
        # symlink to a secret, a sparse file), the tail is read from the file the child was given, from its end.
        fd = os.open(self.log_path, os.O_RDWR | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        self._log_file = os.fdopen(fd, "ab")
        self._env = dict(env)
        self._read = [Path(p) for p in (read if read is not None else _default_read(module, self.workdir))]
        self._write = [Path(p) for p in write]
        self.proc: subprocess.Popen | None = None
        self.started_at: float | None = None  # (wall clock) when the process was started
        self._req = None
        self._rep_fd = -1
        self._buf = bytearray()
        self._scanned = 0  # bytes of _buf known to hold no newline: each byte is searched once
        self._nonce = ""
        self.peak_rss_bytes = 0
        self._memory_error: ChildDied | None = None
        self._inner_pid: int | None = None

    def _start(self, first: dict) -> None:
        read, write = list(self._read), list(self._write)
        write += [Path(p) for p in first.get("extra_write") or []]
        if first.get("library"):
            read.append(Path(first["library"]))
        problem = first.get("problem") or {}
        for key in ("path", "root"):
            if problem.get(key):
                read.append(Path(problem[key]).absolute())
        wd = self.workdir.resolve()
        for key in _CACHE_VARIABLES:
            value = self._env.get(key)
            if value and not Path(value).resolve().is_relative_to(wd):
                write.append(Path(value))
        for entry in self._env.get("PYTHONPATH", "").split(os.pathsep):
            if entry and not bwrap.RUNNER_PACKAGE.is_relative_to(Path(entry).resolve()):
                read.append(Path(entry))  # (fusebot's own checkout: only its runner package is visible)
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        env = {**self._env, "FUSEBOT_REQUEST_FD": str(req_r), "FUSEBOT_REPLY_FD": str(rep_w)}
        tmpfs = self.limits.tmpfs_bytes or self.limits.memory_bytes
        cmd = bwrap.wrap([sys.executable, "-m", self.module], self.workdir, write=write, read=read, tmpfs_bytes=tmpfs)
        self.started_at = time.time()
        try:
            self.proc = bwrap.popen(cmd, cwd=self.workdir, env=env, stdin=subprocess.DEVNULL,
                                    stdout=self._log_file, stderr=subprocess.STDOUT, pass_fds=(req_r, rep_w),
                                    start_new_session=True)
        finally:
            for fd in (req_r, rep_w):
                os.close(fd)
        self._req = os.fdopen(req_w, "w", buffering=1)
        self._rep_fd = rep_r

    def log_tail(self, n_bytes: int = 4000) -> str:
        """The last `n_bytes` of the child's output, scrubbed of credentials and of paths outside its directory."""
        return scrub(read_tail(self._log_file.fileno(), n_bytes), job_dirs=[self.workdir], limit_chars=n_bytes)

    def _sandbox_pids(self) -> list[psutil.Process]:
        p = psutil.Process(self.proc.pid)
        return [p, *p.children(recursive=True)]  # in a PID namespace: every process of the sandbox

    def _tmpfs_bytes(self) -> int:
        """What the sandbox's private /tmp and /dev/shm hold (memory, like its resident pages)."""
        if self.mode.bwrap is None:
            return 0
        try:
            inits = psutil.Process(self.proc.pid).children()
        except psutil.Error:
            return 0
        if not inits:
            return 0
        root = f"/proc/{inits[0].pid}/root"  # bwrap's child: PID 1 of the sandbox, its root the sandbox's
        used = 0
        for mount in ("tmp", "dev/shm"):
            try:
                st = os.statvfs(f"{root}/{mount}")
            except OSError:
                continue
            used += (st.f_blocks - st.f_bfree) * st.f_frsize
        return used

    def _files_bytes(self) -> int:
        """What the files in the child's own directory occupy (allocated blocks: a sparse file costs what it holds).
        Its directory may be on /dev/shm, where a file is memory; elsewhere it is disk the evaluation removes."""
        used, stack = 0, [str(self.workdir)]
        while stack:
            with contextlib.suppress(OSError), os.scandir(stack.pop()) as it:
                for entry in it:
                    with contextlib.suppress(OSError):
                        if entry.is_dir(follow_symlinks=False):
                            stack.append(entry.path)
                        elif entry.is_file(follow_symlinks=False):
                            used += entry.stat(follow_symlinks=False).st_blocks * 512
        return used

    def _rss(self) -> int:
        """The sandbox's memory as the kernel accounts it: each process's proportional set size (a page shared by N
        forks counts 1/N in each: 200 forked sleepers summed by resident size read as 33.7 GiB), its private tmpfs
        files and the files in its own directory. A process's PSS costs the parent a walk of its page tables (30-40
        ms a torch process on the loaded 2-core development host, against microseconds for its resident size), and
        it is never more than the resident size: it is read only where the resident sizes sum over the cap."""
        try:
            procs = self._sandbox_pids()
        except psutil.Error:
            return 0
        files = self._tmpfs_bytes() + self._files_bytes()
        resident = 0
        for q in procs:
            with contextlib.suppress(psutil.Error):
                resident += q.memory_info().rss
        if resident + files <= self.limits.memory_bytes:
            return resident + files
        total = 0
        for q in procs:
            try:
                total += q.memory_full_info().pss
            except psutil.AccessDenied:
                with contextlib.suppress(psutil.Error):
                    total += q.memory_info().rss
            except psutil.Error:
                pass
        return total + files

    def request(self, payload: dict, timeout_s: float) -> dict:
        """Send one request and wait for its reply. Raises ChildDied on crash, timeout or memory cap."""
        self.send(payload)
        return self.receive(payload.get("cmd", "?"), timeout_s)

    def send(self, payload: dict) -> None:
        """Send a request without waiting: several children can work on theirs at once (see `receive`)."""
        if self.proc is None:
            self._start(payload)
        self._nonce = secrets.token_hex(8)
        payload = {**payload, "nonce": self._nonce}
        try:
            self._req.write(json.dumps(payload) + "\n")
            self._req.flush()
        except (BrokenPipeError, OSError):
            self._raise_dead(payload.get("cmd", "?"))

    def check_memory(self) -> None:
        """Kill the child if it is over its memory cap; the next receive() then reports why."""
        if self._memory_error is not None or self.proc is None or self.proc.poll() is not None:
            return
        rss = self._rss()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if rss > self.limits.memory_bytes:
            self.kill()
            self._memory_error = ChildDied(
                "memory",
                f"memory (proportional set size, private tmpfs and its directory's files) {rss / 2**30:.1f} GiB "
                f"over the cap of "
                f"{self.limits.memory_bytes / 2**30:.1f} GiB",
                self.log_tail(),
            )

    def receive(self, cmd: str, timeout_s: float, siblings: tuple[Child, ...] = ()) -> dict:
        """Wait for the reply to the last request. While waiting, the memory cap of this child and of `siblings`
        (children with requests of their own in flight) is enforced."""
        deadline = time.monotonic() + timeout_s
        end = self._buf.find(b"\n", self._scanned)
        while end < 0:
            if self._memory_error is not None:
                raise self._memory_error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise ChildDied("timeout", f"no answer to {cmd!r} within {timeout_s:.0f} s", self.log_tail())
            ready, _, _ = select.select([self._rep_fd], [], [], min(remaining, self.limits.poll_seconds))
            for w in (self, *siblings):
                w.check_memory()
            if self._memory_error is not None:
                raise self._memory_error
            if ready:
                chunk = os.read(self._rep_fd, 1 << 20)
                if not chunk:
                    self._raise_dead(cmd)
                self._scanned = len(self._buf)
                self._buf += chunk
                end = self._buf.find(b"\n", self._scanned)
                if (end if end >= 0 else len(self._buf)) > self.limits.reply_bytes:
                    self._refuse(f"a reply to {cmd!r} over {self.limits.reply_bytes} bytes")
        line = bytes(self._buf[:end])
        del self._buf[:end + 1]
        self._scanned = 0
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            self._refuse(f"unreadable reply: {exc}")
        if not isinstance(reply, dict):
            self._refuse("reply is not an object")
        if reply.pop("nonce", None) != self._nonce:
            self._refuse(f"a reply to {cmd!r} that does not carry its request's tag (untagged, or out of order)")
        return reply

    def _refuse(self, why: str) -> None:
        """A reply the framing refuses: the child is killed and the buffer dropped; its verdict is a crash."""
        self.kill()
        self._buf = bytearray()
        self._scanned = 0
        raise ChildDied("crash", why, self.log_tail())

    def _raise_dead(self, cmd: str) -> None:
        if self._memory_error is not None:
            raise self._memory_error
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        if code is not None and self.mode.bwrap is not None and 128 < code < 128 + 65:
            code = 128 - code  # bwrap exits 128+N when its command was killed by signal N
        how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
        raise ChildDied("crash", f"process died during {cmd!r} ({how})", self.log_tail())

    def kill(self) -> None:
        """Kill the child's whole process tree: bwrap dies, its PID namespace's init with it (--die-with-parent),
        and the kernel kills every process left in the namespace (setsid daemons, double-forked orphans)."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            bwrap.kill_tree(self.proc.pid)
            self.proc.wait()

    def close(self, timeout_s: float = 10.0) -> None:
        # every process of the sandbox now: when the child exits, what it left (daemons) must be gone too
        procs = bwrap.tree(self.proc.pid) if self.proc is not None else []
        if self.proc is not None and self.proc.poll() is None:
            try:
                self._req.write(json.dumps({"cmd": "exit"}) + "\n")
                self._req.flush()
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        if procs:
            bwrap.kill_tree(None, also=procs)  # (bwrap itself is reaped: its PID is no longer its own)
        if self._req is not None:
            with contextlib.suppress(OSError):
                self._req.close()
        if self._rep_fd >= 0:
            with contextlib.suppress(OSError):
                os.close(self._rep_fd)
            self._rep_fd = -1
        self._log_file.close()

    def __enter__(self) -> Child:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(handlers: dict, state: object) -> None:
    """Child side: read requests from fd 3, answer on fd 4. A handler returns a dict; an exception becomes
    {"ok": false, "error": ...} so that the parent decides what it means."""
    import traceback

    # bound before any candidate code runs: a candidate that rewrites json.dumps does not rewrite the replies with it
    # (it can still rewrite its handlers: what a reply says is evidence the parent checks, never a verdict)
    dumps, loads = json.JSONEncoder().encode, json.loads
    req = os.fdopen(int(os.environ.pop("FUSEBOT_REQUEST_FD")), "r")
    rep = os.fdopen(int(os.environ.pop("FUSEBOT_REPLY_FD")), "w", buffering=1)
    for line in req:
        msg = loads(line)
        cmd = msg.get("cmd")
        if cmd == "exit":
            break
        handler = handlers.get(cmd)
        try:
            if handler is None:
                raise ValueError(f"unknown command {cmd!r}")
            reply = handler(state, msg)
            reply.setdefault("ok", True)
        except BaseException as exc:  # noqa: BLE001 - every failure is reported, the parent decides
            reply = {"ok": False, "error": f"{type(exc).__name__}: {exc}", "traceback": traceback.format_exc()}
        reply["nonce"] = msg.get("nonce")  # the request's tag: a reply is matched to the request it answers
        rep.write(dumps(reply) + "\n")
        rep.flush()
    rep.close()
    os._exit(0)
