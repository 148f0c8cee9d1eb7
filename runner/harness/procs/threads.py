"""The parent's own look at a child's threads, from the kernel's accounting (/proc), which the candidate's process
cannot rewrite: its in-process guards report what they see, but that process is the candidate's, and so is every
reply it sends (a candidate that rewrote its serializer or its dispatch dict answered "all clear").

Between requests a child waits on its request pipe: every thread of every process of its sandbox should be asleep.
A thread the kernel shows running ('R': on a CPU or runnable, so a loaded host changes nothing) in every sample of
a window, while the child has no request in flight, is work the candidate left running.
"""

from __future__ import annotations

import contextlib
import os
import time

import psutil

SAMPLES = 5
INTERVAL_S = 0.05  # after a first wait of the same length: a thread pool spinning at its barrier has parked by then


def _states(pids: list[int]) -> dict[tuple[int, int], tuple[str, str]]:
    """(pid, tid) -> (state letter, thread name), for every thread of `pids` readable now."""
    seen = {}
    for pid in pids:
        with contextlib.suppress(OSError):
            for tid in os.listdir(f"/proc/{pid}/task"):
                with contextlib.suppress(OSError, ValueError, IndexError):
                    with open(f"/proc/{pid}/task/{tid}/stat") as f:
                        raw = f.read()
                    name = raw[raw.index("(") + 1:raw.rindex(")")]
                    seen[(pid, int(tid))] = (raw[raw.rindex(")") + 2], name)
    return seen


def sandbox_pids(root_pid: int) -> list[int]:
    try:
        p = psutil.Process(root_pid)
        return [p.pid, *(c.pid for c in p.children(recursive=True))]
    except psutil.Error:
        return []


def busy_threads(root_pid: int, samples: int = SAMPLES, interval_s: float = INTERVAL_S, sleep=time.sleep) -> list[str]:
    """Threads of the sandbox under `root_pid` running in every one of `samples` samples, `interval_s` apart (after
    a first wait of `interval_s`): 'name (pid/tid)' for each."""
    always: dict[tuple[int, int], str] | None = None
    for _ in range(samples):
        sleep(interval_s)
        running = {k: name for k, (state, name) in _states(sandbox_pids(root_pid)).items() if state == "R"}
        always = running if always is None else {k: v for k, v in always.items() if k in running}
        if not always:
            return []
    return [f"{name} ({pid}/{tid})" for (pid, tid), name in sorted(always.items())]


def reason(root_pid: int) -> str | None:
    busy = busy_threads(root_pid)
    if not busy:
        return None
    return (f"background-thread: {len(busy)} thread(s) of the candidate's processes kept running while it had no "
            f"request to serve, by the kernel's accounting ({', '.join(busy[:5])})")
