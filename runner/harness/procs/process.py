"""A worker process the harness talks to: JSON lines over two private pipes, with a timeout and a memory cap.

The parent never unpickles anything a worker sends (a candidate could make pickle run code in the parent): requests
and replies are JSON; bulk tensors travel as raw files in the worker's working directory. The worker's stdout and
stderr go to a log file, so nothing a candidate prints can be taken for a reply.
"""

from __future__ import annotations

import json
import logging
import os
import select
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import psutil

log = logging.getLogger(__name__)



class WorkerDied(Exception):
    """The worker exited, was killed, or stopped answering. `kind` is 'crash', 'timeout' or 'memory'."""

    def __init__(self, kind: str, message: str, log_tail: str = ""):
        super().__init__(message)
        self.kind = kind
        self.log_tail = log_tail


@dataclass
class Limits:
    memory_bytes: int = 32 << 30  # resident memory of the worker and its children
    poll_seconds: float = 0.05


def _signal_name(code: int) -> str:
    try:
        return signal.Signals(-code).name
    except ValueError:
        return f"signal {-code}"


class Worker:
    """`Worker(module, workdir, env)` starts `python -m module` with a request pipe and a reply pipe."""

    def __init__(self, module: str, workdir: Path, env: dict[str, str], limits: Limits | None = None):
        self.workdir = Path(workdir)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.limits = limits or Limits()
        self.log_path = self.workdir / "worker.log"
        req_r, req_w = os.pipe()
        rep_r, rep_w = os.pipe()
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 (closed in close())
        env = {**env, "FUSEBOT_REQUEST_FD": str(req_r), "FUSEBOT_REPLY_FD": str(rep_w)}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", module],
            cwd=self.workdir,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            pass_fds=(req_r, rep_w),
            start_new_session=True,
        )
        for fd in (req_r, rep_w):
            os.close(fd)
        self._req = os.fdopen(req_w, "w", buffering=1)
        self._rep_fd = rep_r
        self._buf = b""
        self.peak_rss_bytes = 0
        self._memory_error: WorkerDied | None = None

    def log_tail(self, n_bytes: int = 4000) -> str:
        try:
            data = self.log_path.read_bytes()
        except OSError:
            return ""
        return data[-n_bytes:].decode(errors="replace")

    def _rss(self) -> int:
        try:
            p = psutil.Process(self.proc.pid)
            return sum(q.memory_info().rss for q in [p, *p.children(recursive=True)])
        except psutil.Error:
            return 0

    def request(self, payload: dict, timeout_s: float) -> dict:
        """Send one request and wait for its reply. Raises WorkerDied on crash, timeout or memory cap."""
        self.send(payload)
        return self.receive(payload.get("cmd", "?"), timeout_s)

    def send(self, payload: dict) -> None:
        """Send a request without waiting: several workers can work on theirs at once (see `receive`)."""
        try:
            self._req.write(json.dumps(payload) + "\n")
            self._req.flush()
        except (BrokenPipeError, OSError):
            self._raise_dead(payload.get("cmd", "?"))

    def check_memory(self) -> None:
        """Kill the worker if it is over its memory cap; the next receive() then reports why."""
        if self._memory_error is not None or self.proc.poll() is not None:
            return
        rss = self._rss()
        self.peak_rss_bytes = max(self.peak_rss_bytes, rss)
        if rss > self.limits.memory_bytes:
            self.kill()
            self._memory_error = WorkerDied(
                "memory",
                f"resident memory {rss / 2**30:.1f} GiB over the cap of {self.limits.memory_bytes / 2**30:.1f} GiB",
                self.log_tail(),
            )

    def receive(self, cmd: str, timeout_s: float, siblings: tuple[Worker, ...] = ()) -> dict:
        """Wait for the reply to the last request. While waiting, the memory cap of this worker and of `siblings`
        (workers with requests of their own in flight) is enforced."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buf:
            if self._memory_error is not None:
                raise self._memory_error
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self.kill()
                raise WorkerDied("timeout", f"no answer to {cmd!r} within {timeout_s:.0f} s", self.log_tail())
            ready, _, _ = select.select([self._rep_fd], [], [], min(remaining, self.limits.poll_seconds))
            for w in (self, *siblings):
                w.check_memory()
            if self._memory_error is not None:
                raise self._memory_error
            if ready:
                chunk = os.read(self._rep_fd, 1 << 20)
                if not chunk:
                    self._raise_dead(cmd)
                self._buf += chunk
        line, self._buf = self._buf.split(b"\n", 1)
        try:
            reply = json.loads(line)
        except json.JSONDecodeError as exc:
            self.kill()
            raise WorkerDied("crash", f"unreadable reply: {exc}", self.log_tail()) from exc
        if not isinstance(reply, dict):
            self.kill()
            raise WorkerDied("crash", "reply is not an object", self.log_tail())
        return reply

    def _raise_dead(self, cmd: str) -> None:
        if self._memory_error is not None:
            raise self._memory_error
        try:
            code = self.proc.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self.kill()
            code = self.proc.returncode
        how = _signal_name(code) if code is not None and code < 0 else f"exit code {code}"
        raise WorkerDied("crash", f"worker died during {cmd!r} ({how})", self.log_tail())

    def kill(self) -> None:
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self.proc.wait()

    def close(self, timeout_s: float = 10.0) -> None:
        if self.proc.poll() is None:
            try:
                self._req.write(json.dumps({"cmd": "exit"}) + "\n")
                self._req.flush()
                self.proc.wait(timeout=timeout_s)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()
        for f in (self._req,):
            try:
                f.close()
            except OSError:
                pass
        try:
            os.close(self._rep_fd)
        except OSError:
            pass
        self._log_file.close()

    def __enter__(self) -> Worker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def serve(handlers: dict, state: object) -> None:
    """Child side: read requests from fd 3, answer on fd 4. A handler returns a dict; an exception becomes
    {"ok": false, "error": ...} so that the parent decides what it means."""
    import traceback

    req = os.fdopen(int(os.environ.pop("FUSEBOT_REQUEST_FD")), "r")
    rep = os.fdopen(int(os.environ.pop("FUSEBOT_REPLY_FD")), "w", buffering=1)
    for line in req:
        msg = json.loads(line)
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
        rep.write(json.dumps(reply) + "\n")
        rep.flush()
    rep.close()
    os._exit(0)
