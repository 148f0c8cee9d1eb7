"""tests/conftest.py's lock: under `pytest -n`, a test marked `timing` runs while no other test runs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

TEST = '''
import json, os, time
import pytest

def record(name, seconds):
    start = time.time()
    time.sleep(seconds)
    with open(os.environ["SPANS"], "a") as f:
        f.write(json.dumps([name, start, time.time()]) + "\\n")
'''


def test_a_timing_test_runs_alone_under_two_processes(tmp_path):
    (tmp_path / "conftest.py").write_text("from tests.conftest import pytest_runtest_protocol, pytest_unconfigure  "
                                          "# noqa: F401\n")
    (tmp_path / "test_timing.py").write_text(TEST + '''
def test_plain_first():
    record("plain", 0.3)

@pytest.mark.timing
def test_timed():
    record("timed", 1.5)
''')
    (tmp_path / "test_others.py").write_text(TEST + "".join(f'''
def test_other_{i}():
    record("other{i}", 0.4)
''' for i in range(6)))
    spans = tmp_path / "spans.jsonl"
    env = {"SPANS": str(spans), "PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"}
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-n", "2", "--dist", "loadfile",
                        "-o", "markers=timing: alone", "--rootdir", str(tmp_path), str(tmp_path)], env=env,
                       capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert p.returncode == 0 and "8 passed" in p.stdout, p.stdout + p.stderr
    rows = [json.loads(line) for line in spans.read_text().splitlines()]
    [(_, t0, t1)] = [r for r in rows if r[0] == "timed"]
    others = [r for r in rows if r[0] != "timed"]
    assert len(others) == 7
    assert all(end <= t0 or start >= t1 for _, start, end in others), rows  # nothing else ran beside it
    assert any(start >= t1 for _, start, _ in others)  # and the others went on after it
