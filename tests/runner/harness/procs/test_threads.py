"""The parent's own look at a child's threads (runner.harness.procs.threads): by the kernel's accounting, a thread
that keeps running is seen whatever the process says; one asleep is not. Runnable counts as running, so a loaded
host sees the same."""

import subprocess
import sys
import time

from runner.harness.procs import threads


def test_a_spinning_thread_is_seen_and_a_sleeping_process_is_not():
    spin = subprocess.Popen([sys.executable, "-c", "import threading, time\n"
                             "def spin():\n    while True:\n        pass\n"
                             "threading.Thread(target=spin, daemon=True, name='spinner').start()\n"
                             "time.sleep(60)\n"])
    idle = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        for _ in range(600):  # until the spinner has started and the main thread sleeps (start-up, not speed)
            states = [s for s, _ in threads._states([spin.pid]).values()]
            if sorted(states) == ["R", "S"]:
                break
            time.sleep(0.05)
        busy = threads.busy_threads(spin.pid, samples=5, interval_s=0.05)
        assert len(busy) == 1 and not busy[0].endswith(f"({spin.pid}/{spin.pid})"), busy
        assert threads.reason(spin.pid).startswith("background-thread")
        assert threads.busy_threads(idle.pid, samples=3, interval_s=0.05) == []
    finally:
        for p in (spin, idle):
            p.kill()
            p.wait()
