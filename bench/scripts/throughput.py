"""Search throughput on the GPU: candidates per GPU-hour, the time to the first timed candidate, and whether the
whole run keeps to its budget, over a handful of real-world problems with the builtin catalog.

    python3 bench/scripts/throughput.py OUT [--budget-seconds 40] [--passes 2] [--problems a,b,c]
                                            [--suite bench/suites/realworld/fp32]

Each problem is optimised as `fusebot optimize` does it (runner/pipeline.py `optimize_problem`: capture and baselines,
search, confirmation, all within the budget) with the builtin catalog, on GPU 0, `--passes` times. The harness cache
is OUT/cache, empty at the start: the first pass times the baselines, the later ones read them from the cache. Per
problem and pass it prints the budget, the wall time, candidates built / verified / timed, the time from the
problem's start to its first timed candidate, and verified candidates per GPU-hour; it writes OUT/results.json
(every number, with the GPU, driver, torch and commit), OUT/README.md (the table) and OUT/run.log (the runner's log).

With the defaults: 6 runs (3 problems, 2 passes) of a 40 s budget each, so about 4 minutes and the start-up.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
PROBLEMS = ("llama_rmsnorm", "gpt2_new_gelu", "bert_residual_layernorm")

log = logging.getLogger("throughput")


@dataclass
class Row:
    problem: str
    run: int  # 1: cold harness cache (baselines timed); 2 and on: baselines from the cache
    budget_s: float
    wall_s: float
    setup_s: float | None  # from the problem's start to the search's (the judge's start; the baselines overlap it)
    built: int
    verified: int
    timed: int
    first_timed_s: float | None  # from the problem's start to its first timed candidate
    error: str = ""

    @property
    def verified_per_gpu_hour(self) -> float:
        return self.verified / (self.wall_s / 3600.0) if self.wall_s > 0 else 0.0

    @property
    def within_budget(self) -> bool:
        return self.wall_s <= 1.1 * self.budget_s


def counts(events: list[dict[str, Any]], setup_s: float | None) -> dict[str, Any]:
    """Candidates built, verified and timed from a search's trace events, and when the first was timed (seconds from
    the problem's start: the search's start offset `setup_s` plus the event's `t_s`)."""
    built = verified = timed = 0
    first: float | None = None
    for ev in events:
        if ev.get("event") != "evaluated":
            continue
        v = ev.get("verdict") or {}
        build = v.get("build") or {}
        if v.get("stage") != "build" and build.get("ok", True):
            built += 1
        if v.get("stage") in ("time", "done"):  # passed verification (then timed, or rejected by the timer)
            verified += 1
        if v.get("timing"):
            timed += 1
            if first is None and setup_s is not None:
                first = setup_s + float(ev.get("t_s", 0.0))
    return {"built": built, "verified": verified, "timed": timed, "first_timed_s": first}


def _fmt(x: float | None, spec: str = ".1f") -> str:
    return "-" if x is None else format(x, spec)


def table(rows: list[Row]) -> str:
    lines = ["| problem | run | budget s | wall s | within 10% | setup s | built | verified | timed | first timed s | "
             "verified per GPU-hour |",
             "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        name = r.problem + (f" (error: {r.error[:80]})" if r.error else "")
        lines.append(f"| {name} | {r.run} | {r.budget_s:.0f} | {r.wall_s:.1f} | {'yes' if r.within_budget else 'no'} | "
                     f"{_fmt(r.setup_s)} | {r.built} | {r.verified} | {r.timed} | {_fmt(r.first_timed_s)} | "
                     f"{r.verified_per_gpu_hour:.0f} |")
    for run in sorted({r.run for r in rows}):
        mine = [r for r in rows if r.run == run and not r.error]
        wall = sum(r.wall_s for r in mine)
        if mine and wall > 0:
            lines.append(f"| all (run {run}) | {run} | | {wall:.1f} | "
                         f"{sum(r.within_budget for r in mine)} of {len(mine)} | | {sum(r.built for r in mine)} | "
                         f"{sum(r.verified for r in mine)} | {sum(r.timed for r in mine)} | | "
                         f"{sum(r.verified for r in mine) / (wall / 3600.0):.0f} |")
    return "\n".join(lines)


def readme(rows: list[Row], meta: dict[str, Any]) -> str:
    return "\n".join([
        "# Search throughput (builtin catalog)", "",
        f"{meta.get('gpu', '')}, driver {meta.get('driver', '')}, torch {meta.get('torch', '')}, CUDA "
        f"{meta.get('cuda', '')}; commit {meta.get('commit', '')}; suite {meta.get('suite', '')}; budget "
        f"{meta.get('budget_seconds', '')} s per problem (the whole run: capture, baselines, search, confirmation).",
        "",
        "Run 1 starts from an empty harness cache (baselines timed, beside the first builds); later runs read the "
        "baselines from it. Setup is the time from the problem's start to the search's. "
        "Verified per GPU-hour is verified candidates over the problem's whole wall time on one GPU; the target is "
        "1500, with the first candidate timed within 10 s of the problem's start.", "",
        table(rows), ""])


def machine() -> dict[str, str]:
    import torch

    def run(cmd: list[str]) -> str:
        try:
            return subprocess.run(cmd, capture_output=True, text=True, timeout=30, cwd=ROOT).stdout.strip()
        except (OSError, subprocess.TimeoutExpired):
            return ""

    return {"gpu": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "none",
            "driver": (run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines() or
                       [""])[0],
            "torch": torch.__version__, "cuda": torch.version.cuda or "", "commit": run(["git", "rev-parse", "HEAD"])}


def optimize_one(path: Path, out: Path, budget_s: float, run: int, backend: str = "cuda") -> Row:
    """One problem, as `fusebot optimize` runs it, timed from before its harness starts."""
    sys.path.insert(0, str(ROOT))
    from runner.cli.target import problem_for
    from runner.contract import SearchBudget
    from runner.harness.evaluator import HarnessConfig
    from runner.harness.gpus import device_evaluators
    from runner.pipeline import TRACE_FILE, make_proposers, optimize_problem
    from runner.search.trace import read_events

    budget = SearchBudget(wall_seconds=budget_s)
    search_start: list[float] = []

    def progress(p) -> None:
        if p.round >= 1 and not search_start:
            search_start.append(time.monotonic())

    t0 = time.monotonic()
    error = ""
    try:
        spec = problem_for(str(path))
        with device_evaluators(spec, backend, [0] if backend == "cuda" else [], HarnessConfig()) as ev:
            optimize_problem(spec, out, budget, make_proposers([]), ev, backend, fresh=True, progress=progress)
    except Exception as e:  # noqa: BLE001 - a broken problem is a row with its error
        error = f"{type(e).__name__}: {e}"
    wall_s = time.monotonic() - t0
    setup_s = search_start[0] - t0 if search_start else None
    events = list(read_events(out / TRACE_FILE)) if (out / TRACE_FILE).exists() else []
    return Row(problem=path.stem, run=run, budget_s=budget_s, wall_s=wall_s, setup_s=setup_s, error=error,
               **counts(events, setup_s))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--budget-seconds", type=float, default=40.0)
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--problems", default=",".join(PROBLEMS))
    ap.add_argument("--suite", type=Path, default=ROOT / "bench/suites/realworld/fp32")
    ap.add_argument("--commit", default="", help="the commit of the tree measured (the GPU machine's copy may have a "
                    "stale .git); default: git rev-parse HEAD")
    ap.add_argument("--backend", default="cuda", help="cpu: a dry run of the script itself (REALWORLD_SUITE_SMALL=1)")
    args = ap.parse_args()
    logging.basicConfig(level="INFO", format="%(asctime)s %(name)s: %(message)s")
    args.out.mkdir(parents=True, exist_ok=True)
    detail = logging.FileHandler(args.out / "run.log")  # the runner's own log, every stage with its time
    detail.setFormatter(logging.Formatter("%(asctime)s %(name)s: %(message)s"))
    runner_log = logging.getLogger("runner")
    runner_log.setLevel(logging.INFO)
    runner_log.propagate = False
    runner_log.addHandler(detail)
    for name in ("runner.harness.contestants", "runner.harness.trials"):  # each load and trial, step by step
        logging.getLogger(name).setLevel(logging.DEBUG)
    os.environ["FUSEBOT_CACHE_DIR"] = str((args.out / "cache").resolve())  # before the harness reads it
    meta = {**machine(), **({"commit": args.commit} if args.commit else {})}
    meta |= {"suite": str(args.suite), "budget_seconds": args.budget_seconds, "passes": args.passes,
            "backend": args.backend}
    rows: list[Row] = []
    for run in range(1, args.passes + 1):
        for name in [p.strip() for p in args.problems.split(",") if p.strip()]:
            row = optimize_one(args.suite / f"{name}.py", args.out / "problems" / f"{name}-{run}",
                               args.budget_seconds, run, args.backend)
            rows.append(row)
            log.info("%s run %d: budget %.0f s, wall %.1f s, built %d, verified %d, timed %d, first timed %s s, "
                     "%.0f verified per GPU-hour%s", row.problem, run, row.budget_s, row.wall_s, row.built,
                     row.verified, row.timed, _fmt(row.first_timed_s), row.verified_per_gpu_hour,
                     f" (error: {row.error})" if row.error else "")
    (args.out / "results.json").write_text(json.dumps(
        {**meta, "rows": [{**asdict(r), "verified_per_gpu_hour": r.verified_per_gpu_hour} for r in rows]}, indent=1))
    (args.out / "README.md").write_text(readme(rows, meta))
    sys.stdout.write(table(rows) + "\n")


if __name__ == "__main__":
    main()
