"""`fusebot eval` end to end as a user runs it: the verdict in words ("correct", "faster"/"slower"), exit status,
table, JSON; the exit statuses of the one table (runner/contract.py)."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

from runner.cli.eval import headline
from runner.contract import Baselines, Verdict
from tests.fakes.evaluators import timing

from ..adversarial import FAST_HACKS, HONEST_FAST
from ..conftest import PROBLEMS

ROOT = Path(__file__).resolve().parents[3]


def run_eval(tmp_path, candidate_text: str, *extra: str, suffix=".cpp", problem="scale_relu.py"):
    cand = tmp_path / f"candidate{suffix}"
    cand.write_text(candidate_text)
    out = tmp_path / "verdict.json"
    proc = subprocess.run(
        [sys.executable, "-m", "bot.cli", "eval", str(PROBLEMS / problem), str(cand), "--json", str(out),
         "--no-compile", *extra],
        capture_output=True, text=True, timeout=600, env={**os.environ, "COLUMNS": "160"},
    )
    return proc, (json.loads(out.read_text()) if out.exists() else None)


def verdict(ms: float | None, eager_ms: float = 1.0, compile_ms: float | None = None, **kw) -> Verdict:
    b = Baselines(eager=timing(eager_ms), compile=timing(compile_ms) if compile_ms else None)
    return Verdict(candidate_id="c", problem="p", accepted=True, baselines=b, timing=timing(ms) if ms else None,
                   speedup_vs_eager=eager_ms / ms if ms else None,
                   speedup_vs_compile=compile_ms / ms if ms and compile_ms else None).model_copy(update=kw)


def test_the_headline_says_correct_and_faster_or_slower():
    assert headline(verdict(100.0)) == "correct, 0.01x vs eager: slower"
    assert headline(verdict(227.0)) == "correct, 0.0044x vs eager: slower"
    assert headline(verdict(0.5, compile_ms=0.8)) == "correct, 2.00x vs eager, 1.60x vs torch.compile: faster"
    assert headline(verdict(0.5, compile_ms=0.4)) == \
        "correct, 2.00x vs eager, 0.80x vs torch.compile: slower than torch.compile"
    assert headline(verdict(None)) == "correct, not timed"
    wrong = verdict(None, accepted=False, stage="verify", reasons=["mismatch: trial 0: max_abs_err 1.0 at [3, 7]",
                                                                    "mismatch: trial 1: ...", "nan-mismatch: trial 2"])
    assert headline(wrong) == "rejected at verify: mismatch, nan-mismatch"
    assert headline(wrong.model_copy(update={"stage": "build", "reasons": ["build: kernel.cpp:3:5: error"]})) == \
        "rejected at build: build"


def test_correct_exits_0_and_writes_the_documented_json(tmp_path):
    proc, verdict = run_eval(tmp_path, HONEST_FAST["kernel.cpp"])
    assert proc.returncode == 0, proc.stdout + proc.stderr
    first = proc.stdout.splitlines()[0]
    assert re.match(r"correct, \S+x vs eager: (faster|slower)  \(candidate candidate, problem scale_relu\)$", first)
    assert "timing (ms)" in proc.stdout and "ACCEPTED" not in proc.stdout
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
    assert verdict["accepted"] is False and verdict["reasons"]  # which checks: tests/runner/harness (adversarial)
    names = ", ".join(dict.fromkeys(r.split(":")[0] for r in verdict["reasons"]))
    assert proc.stdout.startswith(f"rejected at verify: {names}  (candidate candidate, problem scale_relu)\n")
    assert f"\n  x {verdict['reasons'][0]}\n" in proc.stdout


def test_usage_errors_exit_2(tmp_path):
    proc, _ = run_eval(tmp_path, "x", suffix=".txt")
    assert proc.returncode == 2 and proc.stderr.startswith("error: ") and proc.stdout == ""
    missing = subprocess.run([sys.executable, "-m", "bot.cli", "eval", "nope.py", "nope.cpp"],
                             capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2
    mismatch, _ = run_eval(tmp_path, "x", "--backend", "cuda", suffix=".cpp")
    assert mismatch.returncode == 2
    assert mismatch.stderr.endswith("candidate.cpp: a .cpp kernel runs on --backend cpu, not cuda\n")


def test_broken_problem_exits_2_naming_file_and_line_on_stderr(tmp_path):
    proc, _ = run_eval(tmp_path, HONEST_FAST["kernel.cpp"], problem="broken/reference_error.py")
    assert proc.returncode == 2 and proc.stdout == ""
    assert f"{PROBLEMS / 'broken/reference_error.py'}:6" in proc.stderr.splitlines()[0]
