"""bench/realworld_floor.py: problems prepared in a pool and measured one at a time, in order, within a deadline
(injected preparations, measurements and clock), and one tiny problem prepared and measured for real on the CPU
backend, whose evaluator then finds its build in the cache the pool filled."""

from __future__ import annotations

import json
import multiprocessing
import threading
import time
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import bench.realworld_floor as floor  # (by its package name: the pool's processes import it too)
from runner.harness.evaluator import HarnessConfig
from tests.runner.conftest import FAST_TIMER, PROBLEMS


def paths(n: int) -> list[Path]:
    return [Path(f"/suite/fp32/p{k}.py") for k in range(n)]


class Clock:
    def __init__(self) -> None:
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def test_problems_are_measured_in_order_one_at_a_time_while_later_ones_are_still_prepared():
    events: list[str] = []
    lock = threading.Lock()
    measured_first = threading.Event()
    busy = []

    def prepare_one(p: Path) -> dict:
        if p.stem == "p0":
            time.sleep(0.2)  # the first finishes last of the first few: its row still comes first
        if p.stem == "p3":  # ahead of the GPU: still preparing while p0 is measured
            measured_first.wait(5)
        with lock:
            events.append(f"prepared {p.stem}")
        return {"candidates": [], "prepare_s": 0.0}

    def measure_one(p: Path, prep: dict) -> dict:
        busy.append(p)
        assert len(busy) == 1, "two measurements at once"
        with lock:
            events.append(f"measure {p.stem}")
        measured_first.set()
        time.sleep(0.01)
        busy.pop()
        return {"problem": p.stem, "floor_ms": 1.0}

    got: list[dict] = []
    with ThreadPoolExecutor(3) as pool:
        rows = floor.run(paths(4), prepare_one=prepare_one, measure_one=measure_one, pool=pool, ahead=True,
                         deadline=floor.Deadline(None), on_row=got.append)
    assert [r["problem"] for r in rows] == ["p0", "p1", "p2", "p3"] and got == rows
    assert events.index("measure p0") < events.index("prepared p3"), events
    assert rows[0]["preparing_meanwhile"] >= 1


def test_on_the_cpu_backend_every_problem_is_prepared_before_the_first_measurement():
    events: list[str] = []

    def prepare_one(p: Path) -> dict:
        time.sleep(0.02 * int(p.stem[1:]))
        events.append("prepared")
        return {"candidates": []}

    def measure_one(p: Path, prep: dict) -> dict:
        events.append("measure")
        return {"problem": p.stem}

    with ThreadPoolExecutor(2) as pool:
        floor.run(paths(4), prepare_one=prepare_one, measure_one=measure_one, pool=pool, ahead=False,
                  deadline=floor.Deadline(None), on_row=lambda r: None)
    assert events == ["prepared"] * 4 + ["measure"] * 4


def test_no_problem_starts_when_less_time_is_left_than_the_median_problem_took():
    clock = Clock()
    deadline = floor.Deadline(10.0, clock=clock)

    def measure_one(p: Path, prep: dict) -> dict:
        clock.t += 4.0
        return {"problem": p.stem}

    def failing(p: Path, prep: dict) -> dict:
        raise RuntimeError("no GPU")

    try:
        with ThreadPoolExecutor(2) as pool:
            rows = floor.run(paths(5), prepare_one=lambda p: {"candidates": []}, measure_one=measure_one, pool=pool,
                             ahead=True, deadline=deadline, on_row=lambda r: None)
            assert [r["problem"] for r in rows] == ["p0", "p1"]  # at 8 s, 2 s are left, and a problem took 4
            rows = floor.run(paths(1), prepare_one=lambda p: {"candidates": []}, measure_one=failing, pool=pool,
                             ahead=True, deadline=floor.Deadline(None), on_row=lambda r: None)
            assert rows[0]["error"] == "RuntimeError: no GPU"
    finally:
        deadline.close()


def test_files_come_first_then_the_folders_problems_the_first_ones_first_then_by_name(tmp_path):
    for d in ("fp32", "bf16"):
        (tmp_path / d).mkdir()
        for n in ("a", "b", "c", "z"):
            (tmp_path / d / f"{n}.py").write_text("")
    fp32, bf16, other = tmp_path / "fp32", tmp_path / "bf16", tmp_path / "x.py"
    got = floor.ordered([fp32, other, bf16, fp32 / "a.py"], first=("fp32/z", "bf16/a", "fp32/b"))
    assert [f"{p.parent.name}/{p.stem}" for p in got] == [
        f"{tmp_path.name}/x", "fp32/a", "fp32/z", "bf16/a", "fp32/b", "bf16/b", "fp32/c", "bf16/c", "bf16/z"]


def test_the_table_has_floor_compile_best_percent_of_floor_and_best_vs_compile():
    rows = [{"problem": "fp32/a", "floor_ms": 0.1, "compile_ms": 0.3, "best_ms": 0.2, "best_label": "cuda-k"},
            {"problem": "bf16/b", "floor_ms": 0.1, "compile_ms": 0.3, "best_ms": None,
             "candidates": [{"reason": "wrong: output 0"}]}]
    head, a, b = floor.table(rows)
    assert a.split() == ["fp32/a", "0.1", "0.3", "0.2", "50.0%", "1.50x", "cuda-k"]
    assert b.split()[:6] == ["bf16/b", "0.1", "0.3", "-", "-", "-"] and b.endswith("wrong: output 0")
    assert "% floor" in head and "vs compile" in head


def test_a_problem_prepared_in_a_pool_process_is_measured_by_the_harness_from_its_build_cache(tmp_path):
    """The CPU backend, one tiny problem: the pool's process captures it, renders its first candidate and builds it;
    the harness's evaluator then verifies and times that candidate, and its build is the pool's (a cache hit)."""
    problem = tmp_path / "cpu" / "scale_relu.py"
    problem.parent.mkdir()
    problem.write_text((PROBLEMS / "scale_relu.py").read_text())
    cache = tmp_path / "cache"
    config = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=cache, bandwidth_bytes_per_s=1e10)
    out = tmp_path / "rows.json"
    rows: list[dict] = []

    def on_row(r: dict) -> None:
        rows.append(r)
        floor.write(out, {"label": "test"}, rows)

    deadline = floor.Deadline(None)
    with ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        floor.run([problem], prepare_one=floor._Prepare("cpu", 1, None, cache), pool=pool, ahead=False,
                  measure_one=lambda p, prep: floor.measure(p, prep, "cpu", config, deadline), deadline=deadline,
                  on_row=on_row)
    (row,) = json.loads(out.read_text())["rows"]
    assert row["problem"] == "cpu/scale_relu" and row["prepare_s"] > 0 and "prepare_error" not in row
    (cand,) = row["candidates"]
    assert cand["accepted"], cand["reason"]
    assert cand["build_cached"] is True, "the evaluator built it again"
    assert row["best_ms"] == cand["median_ms"] > 0 and row["floor_ms"] > 0 and row["eager_ms"] > 0


def test_also_adds_each_first_parameter_sets_variant_where_it_is_another_kernel(monkeypatch):
    """--also buffers=1: after each strategy's first parameter set that renders, its twin with one buffer, where the
    twin is another kernel (another label: a regs kernel's) and renders; none for the rows layout (the same kernel)
    nor for a non-CUDA parameter set."""
    from types import SimpleNamespace

    from runner.catalog.codegen.common import NotExpressible
    from runner.catalog.codegen.cpu import CpuParams
    from runner.catalog.codegen.cuda import CudaParams

    regs = CudaParams("regs", vec=8, threads=256, group=0, mode="twopass")
    wide = CudaParams("regs", vec=8, threads=512, group=0, mode="twopass")  # refused, with its twin
    rows = CudaParams("rows", vec=8, threads=256, group=32)
    cpu = CpuParams("flat", threads="one")

    class Proposer:
        def pattern(self, ctx):
            return None

        def strategies(self, ctx):
            return [SimpleNamespace(params=[wide, regs]), SimpleNamespace(params=[rows]), SimpleNamespace(params=[cpu])]

        def candidate(self, ctx, pat, p):
            if p.threads == 512:
                raise NotExpressible("too wide")
            return p

    monkeypatch.setattr(floor, "CatalogProposer", Proposer)
    assert floor.parse_also("buffers=1,fast_math=true,layout=regs") == {"buffers": 1, "fast_math": True, "layout": "regs"}
    got = floor.candidates(Path(__file__), "cuda", 3, (floor.parse_also("buffers=1"),))
    assert got == [regs, replace(regs, buffers=1), rows, cpu]
    assert [p.label() for p in got[:2]] == ["cuda-regs-v8-t256-g256-twopass", "cuda-regs-v8-t256-g256-twopass-b1"]
    assert floor.candidates(Path(__file__), "cuda", 3) == [regs, rows, cpu]
