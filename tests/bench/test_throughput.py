"""bench/scripts/throughput.py's figures, from injected trace events and wall times (the GPU run is the lead's)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "scripts" / "throughput.py"
spec = importlib.util.spec_from_file_location("throughput", SCRIPT)
throughput = sys.modules["throughput"] = importlib.util.module_from_spec(spec)  # (its dataclass looks itself up)
spec.loader.exec_module(throughput)


def evaluated(t_s: float, stage: str, build_ok: bool = True, timed: bool = False) -> dict:
    verdict = {"stage": stage, "build": {"ok": build_ok}, "timing": {"median_ms": 0.1} if timed else None}
    return {"event": "evaluated", "t_s": t_s, "verdict": verdict}


EVENTS = [
    {"event": "start", "t_s": 0.0},
    evaluated(1.5, "build", build_ok=False),  # did not build
    evaluated(2.0, "verify"),  # built, rejected at verification
    evaluated(3.0, "time"),  # verified, rejected by the timer
    evaluated(4.25, "done", timed=True),  # the first timed
    evaluated(5.0, "done", timed=True),
    {"event": "round", "t_s": 5.5},
]


def test_counts_read_built_verified_timed_and_the_first_timed_from_the_problems_start():
    c = throughput.counts(EVENTS, setup_s=6.0)
    assert c == {"built": 4, "verified": 3, "timed": 2, "first_timed_s": 10.25}
    assert throughput.counts(EVENTS, setup_s=None)["first_timed_s"] is None
    assert throughput.counts([], setup_s=1.0) == {"built": 0, "verified": 0, "timed": 0, "first_timed_s": None}


def row(**kw) -> object:
    base = dict(problem="llama_rmsnorm", run=1, budget_s=30.0, wall_s=32.0, setup_s=6.0, built=40, verified=30,
                timed=28, first_timed_s=9.5)
    return throughput.Row(**{**base, **kw})


def test_candidates_per_gpu_hour_and_the_budget_check():
    r = row()
    assert r.verified_per_gpu_hour == pytest.approx(30 / (32 / 3600))
    assert r.within_budget and not row(wall_s=33.5).within_budget  # 10% over 30 s is 33 s
    assert row(wall_s=0.0).verified_per_gpu_hour == 0.0


def test_the_table_has_a_row_per_problem_and_run_and_a_total_per_run():
    rows = [row(), row(problem="gpt2_new_gelu", wall_s=36.0, verified=12, built=20, timed=12, first_timed_s=None),
            row(run=2, wall_s=30.5, setup_s=1.0, first_timed_s=2.5), row(problem="broken", run=2, error="ProblemError: x")]
    lines = throughput.table(rows).splitlines()
    assert lines[2] == "| llama_rmsnorm | 1 | 30 | 32.0 | yes | 6.0 | 40 | 30 | 28 | 9.5 | 3375 |"
    assert lines[3] == "| gpt2_new_gelu | 1 | 30 | 36.0 | no | 6.0 | 20 | 12 | 12 | - | 1200 |"
    assert lines[5].startswith("| broken (error: ProblemError: x) | 2 |")
    # totals leave out the broken problem: 42 verified over 68 s, 30 over 30.5 s
    assert lines[6] == "| all (run 1) | 1 | | 68.0 | 1 of 2 | | 60 | 42 | 40 | | 2224 |"
    assert lines[7] == "| all (run 2) | 2 | | 30.5 | 1 of 1 | | 40 | 30 | 28 | | 3541 |"


def test_the_readme_names_the_machine_and_the_budget():
    text = throughput.readme([row()], {"gpu": "NVIDIA H200", "driver": "570.1", "torch": "2.7.0", "cuda": "12.8",
                                       "commit": "abc", "suite": "bench/suites/realworld/fp32", "budget_seconds": 30})
    assert "NVIDIA H200, driver 570.1, torch 2.7.0, CUDA 12.8; commit abc" in text
    assert "budget 30 s per problem" in text and "| llama_rmsnorm | 1 |" in text
