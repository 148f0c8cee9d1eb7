"""What a candidate may not change in its own process: torch's and the clock's functions, global numeric flags, and
the set of running threads. A snapshot is taken before the candidate is imported; `violations()` after each step
names every difference. Each reason starts with the name of the check ("monkeypatch:", "global-state:", ...).
"""

from __future__ import annotations

import os
import threading
import time
import types

import torch

from runner.harness import timing, verify

_WATCHED_MODULES: dict[str, object] = {
    "torch": torch,
    "torch.Tensor": torch.Tensor,
    "torch.nn.functional": torch.nn.functional,
    "torch.nn.Module": torch.nn.Module,
    "torch.cuda": torch.cuda,
    "torch.cuda.Event": torch.cuda.Event,
    "torch.cuda.Stream": torch.cuda.Stream,
    "torch.testing": torch.testing,
    "torch._C": torch._C,
    "torch.autograd": torch.autograd,
    "torch.profiler": torch.profiler,
    "time": time,
    "threading": threading,
    "runner.harness.timing": timing,  # the timer's bound callables (a constructor in a shared library can run Python)
    "runner.harness.timing.Timer": timing.Timer,
    "runner.harness.verify": verify,
}


def _ident(value: object) -> int:
    # Bound builtins are recreated on each attribute read; identify them by their function and receiver.
    if isinstance(value, types.BuiltinMethodType) and value.__self__ is not None:
        return hash((id(value.__self__), value.__name__))
    return id(value)


def _attributes(obj: object) -> dict[str, int]:
    """Identities of the callables an object holds. Data attributes (caches, counters) change legitimately, e.g.
    torch.cuda._cached_device_count is filled in on first use."""
    return {name: _ident(val) for name, val in list(vars(obj).items()) if not name.startswith("__") and callable(val)}


def _flags() -> dict[str, object]:
    b = torch.backends
    flags = {
        "torch.backends.cuda.matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "torch.backends.cudnn.allow_tf32": b.cudnn.allow_tf32,
        "torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction": (
            b.cuda.matmul.allow_fp16_reduced_precision_reduction
        ),
        "torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction": (
            b.cuda.matmul.allow_bf16_reduced_precision_reduction
        ),
        "torch.backends.cudnn.benchmark": b.cudnn.benchmark,
        "torch.backends.cudnn.deterministic": b.cudnn.deterministic,
        "torch.backends.cudnn.enabled": b.cudnn.enabled,
        "torch.get_float32_matmul_precision()": torch.get_float32_matmul_precision(),
        "torch.get_default_dtype()": str(torch.get_default_dtype()),
        "torch.are_deterministic_algorithms_enabled()": torch.are_deterministic_algorithms_enabled(),
        "torch.is_grad_enabled()": torch.is_grad_enabled(),
        "torch.get_num_threads()": torch.get_num_threads(),
    }
    return flags


IDLE_WINDOW_S = 0.05  # a thread that uses no CPU over this long, and is not running, is idle


def _thread_state(tid: int) -> tuple[str, int] | None:
    """(state letter, user + system clock ticks) of one of this process's threads; None if it has exited."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return fields[0], int(fields[11]) + int(fields[12])


def busy_threads(tids: set[int]) -> set[int]:
    """The threads among `tids` that are running now or used CPU over IDLE_WINDOW_S. An idle thread pool (OpenMP's
    threads, parked on a futex after the call) is not background work; a thread still computing is. Two windows:
    a pool's threads spin a little before they park."""
    busy = set(tids)
    for _ in range(2):
        first = {t: _thread_state(t) for t in busy}
        time.sleep(IDLE_WINDOW_S)
        busy = set()
        for t, before in first.items():
            after = _thread_state(t)
            if before is not None and after is not None and (after[0] == "R" or after[1] != before[1]):
                busy.add(t)
        if not busy:
            break
    return busy


def _native_threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir("/proc/self/task")}
    except OSError:
        return set()


class Guard:
    """Snapshot now; `violations()` later lists what changed. `extra`: more modules or classes to watch (the
    worker's own module, whose functions call the candidate and write its outputs)."""

    def __init__(self, extra: dict[str, object] | None = None) -> None:
        self.watched = {**_WATCHED_MODULES, **(extra or {})}
        self.attrs = {name: _attributes(obj) for name, obj in self.watched.items()}
        self.flags = _flags()
        self.threads = {t.ident for t in threading.enumerate()}
        self.native = _native_threads()

    def rebaseline_threads(self) -> None:
        """Accept the threads alive now (e.g. the runtime's own pools started by a warm-up before the candidate)."""
        self.threads = {t.ident for t in threading.enumerate()}
        self.native = _native_threads()

    def violations(self) -> list[str]:
        reasons = []
        for name, obj in self.watched.items():
            now = _attributes(obj)
            before = self.attrs[name]
            changed = sorted(k for k, v in before.items() if now.get(k, v) != v)
            if changed:
                shown = ", ".join(f"{name}.{k}" for k in changed[:6])
                more = f" (+{len(changed) - 6} more)" if len(changed) > 6 else ""
                reasons.append(f"monkeypatch: the candidate replaced {shown}{more}")
        for flag, value in _flags().items():
            if value != self.flags[flag]:
                reasons.append(
                    f"global-state: the candidate changed {flag} from {self.flags[flag]!r} to {value!r}, "
                    "which would change every other computation in the process"
                )
        extra = [t for t in threading.enumerate() if t.ident not in self.threads and t.is_alive()]
        if extra:
            names = ", ".join(t.name for t in extra[:4])
            reasons.append(f"background-thread: {len(extra)} Python thread(s) still running after the call ({names})")
        else:
            new_native = busy_threads(_native_threads() - self.native)
            if new_native:
                reasons.append(f"background-thread: {len(new_native)} native thread(s) started by the candidate are "
                               f"still running after the call (using CPU over {IDLE_WINDOW_S * 1000:.0f} ms)")
        return reasons

    def restore_flags(self) -> None:
        """Put global flags back, so that a violation reported once does not also spoil later measurements."""
        b = torch.backends
        f = self.flags
        b.cuda.matmul.allow_tf32 = f["torch.backends.cuda.matmul.allow_tf32"]
        b.cudnn.allow_tf32 = f["torch.backends.cudnn.allow_tf32"]
        b.cudnn.benchmark = f["torch.backends.cudnn.benchmark"]
        b.cudnn.deterministic = f["torch.backends.cudnn.deterministic"]
        torch.set_float32_matmul_precision(f["torch.get_float32_matmul_precision()"])
