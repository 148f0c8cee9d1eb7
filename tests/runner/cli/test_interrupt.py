"""Ctrl-C on `fusebot optimize`: a real SIGINT to the command's process says how to resume, and exits with 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_ctrl_c_says_the_same_command_resumes_from_the_trace_and_exits_130(tmp_path):
    out, ready = tmp_path / "out", tmp_path / "ready"
    proc = subprocess.Popen([sys.executable, "-m", "tests.runner.cli.interrupt_optimize", str(out), str(ready)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, "COLUMNS": "300"})
    try:
        waited = time.monotonic()
        while not ready.exists():  # the search is evaluating its first chunk, which never ends by itself
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() - waited < 120, "the search never started"
            time.sleep(0.05)
        proc.send_signal(signal.SIGINT)
        try:
            stdout, stderr = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGUSR1)  # every thread's stack, for the failure's message
            time.sleep(2)
            proc.kill()
            stdout, stderr = proc.communicate()
            raise AssertionError(f"still running 60 s after Ctrl-C:\n{stderr[-8000:]}") from None
    finally:
        proc.kill()
    assert proc.returncode == 130, (stdout, stderr)
    assert f"interrupted: the same command resumes from {out / 'trace.jsonl'}" in stderr, stderr
    assert "Traceback" not in stderr, stderr
    assert (out / "trace.jsonl").exists() and '"event": "start"' in (out / "trace.jsonl").read_text()
