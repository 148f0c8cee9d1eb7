"""`fusebot eval` end to end as a user runs it: exit status, table, JSON."""

import json
import subprocess
import sys

from ..adversarial import FAST_HACKS, HONEST_FAST
from ..conftest import PROBLEMS


def run_eval(tmp_path, candidate_text: str, *extra: str, suffix=".cpp", problem="scale_relu.py"):
    cand = tmp_path / f"candidate{suffix}"
    cand.write_text(candidate_text)
    out = tmp_path / "verdict.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "eval", str(PROBLEMS / problem), str(cand), "--json", str(out),
         "--no-compile", *extra],
        capture_output=True, text=True, timeout=600, env={**__import__("os").environ, "COLUMNS": "160"},
    )
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def test_accepted_exits_0_and_writes_the_documented_json(tmp_path):
    proc, verdict = run_eval(tmp_path, HONEST_FAST["kernel.cpp"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "ACCEPTED" in proc.stdout and "timing (ms)" in proc.stdout
    assert verdict["accepted"] is True and verdict["reasons"] == []
    assert len(verdict["trials"]) == 7 and all("max_abs_err" in t for t in verdict["trials"])
    assert len(verdict["timing"]["samples_ms"]) == verdict["timing"]["n"]
    assert verdict["baselines"]["eager"]["median_ms"] > 0
    assert verdict["roofline"]["floor_ms"] > 0
    env = verdict["environment"]
    assert {"gpu", "driver", "cuda", "torch", "fusebot"} <= set(env)


def test_rejected_exits_1_with_reasons(tmp_path):
    proc, verdict = run_eval(tmp_path, FAST_HACKS["partial_computation"][0]["kernel.cpp"])
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "REJECTED" in proc.stdout
    assert verdict["accepted"] is False and verdict["reasons"][0].startswith("uninitialized-output")


def test_usage_errors_exit_2(tmp_path):
    proc, _ = run_eval(tmp_path, "x", suffix=".txt")
    assert proc.returncode == 2
    missing = subprocess.run([sys.executable, "-m", "bot.cli", "eval", "nope.py", "nope.cpp"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2


def test_broken_problem_exits_2_naming_file_and_line(tmp_path):
    proc, _ = run_eval(tmp_path, HONEST_FAST["kernel.cpp"], problem="broken/reference_error.py")
    assert proc.returncode == 2
    assert "reference_error.py:6" in proc.stdout
