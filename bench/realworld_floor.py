"""The catalog's generated kernels on real-world problems against the memory floor, one problem at a time.

For each problem: eager and torch.compile as the harness times them, the floor (bytes moved / the device's copy
rate, the harness's roofline) and the first parameter set of each of the catalog's first `--strategies` strategies,
each built, verified against the float64 oracle and timed by the harness (no search). Rows are written to `--out`
(JSON) as they finish, so a run cut short keeps what it measured; a short table goes to the log.

    python bench/realworld_floor.py --out before.json --no-compile bench/suites/realworld/fp32/llama_rmsnorm.py ...

`bench/realworld_floor.sh` runs it on the GPU machine for the tree it is in and for the repository root's tree
(before and after a change), then `bench/realworld_table.py` writes the tables.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import time
from pathlib import Path

from runner.catalog.codegen.common import NotExpressible
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import problem_from_file
from runner.proposers.catalog import CatalogProposer, label_of
from runner.search.types import ProblemContext

log = logging.getLogger("realworld_floor")


def candidates(path: Path, backend: str, strategies: int) -> list:
    """The first parameter set of each of the catalog's first `strategies` strategies that renders."""
    prop = CatalogProposer()
    ctx = ProblemContext(name=path.stem, reference_source=path.read_text(), backend=backend)
    pat = prop.pattern(ctx)
    out = []
    for s in prop.strategies(ctx)[:strategies]:
        for p in s.params[:3]:
            try:
                out.append(prop.candidate(ctx, pat, p))
                break
            except NotExpressible:
                continue
    return out


def measure(path: Path, backend: str, strategies: int, compile_baseline: bool) -> dict:
    row: dict = {"problem": f"{path.parent.name}/{path.stem}"}
    t0 = time.monotonic()
    cands = candidates(path, backend, strategies)
    with Evaluator(problem_from_file(path), backend=backend, config=HarnessConfig(compile_baseline=compile_baseline)) as ev:
        base = ev.baselines()
        roof = ev.roofline()
        row["eager_ms"] = base.eager.median_ms if base.eager else None
        row["compile_ms"] = base.compile.median_ms if base.compile else None
        row["floor_ms"] = roof.floor_ms if roof else None
        row["bytes_moved"] = roof.bytes_moved if roof else None
        row["bandwidth_bytes_per_s"] = roof.bandwidth_bytes_per_s if roof else None
        verdicts = ev.evaluate_many(cands) if cands else []
    row["candidates"] = [{"label": label_of(c), "accepted": v.accepted,
                          "median_ms": v.timing.median_ms if v.accepted and v.timing else None,
                          "reason": "; ".join(v.reasons)[:300]} for c, v in zip(cands, verdicts, strict=True)]
    ok = [c for c in row["candidates"] if c["median_ms"]]
    best = min(ok, key=lambda c: c["median_ms"]) if ok else None
    row["best_label"], row["best_ms"] = (best["label"], best["median_ms"]) if best else (None, None)
    row["seconds"] = time.monotonic() - t0
    return row


def commit() -> str:
    """FUSEBOT_COMMIT where set (the GPU machine's copy of the tree may carry a stale .git), else HEAD."""
    if os.environ.get("FUSEBOT_COMMIT"):
        return os.environ["FUSEBOT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+", type=Path)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--strategies", type=int, default=4)
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--deadline-s", type=float, default=0, help="start no problem after this many seconds")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    import torch

    env = {"label": args.label, "commit": commit(), "torch": torch.__version__,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    rows: list[dict] = []
    t0 = time.monotonic()
    for path in args.problems:
        if args.deadline_s and time.monotonic() - t0 > args.deadline_s:
            log.warning("deadline: %s not run", path)
            continue
        try:
            rows.append(measure(path, args.backend, args.strategies, not args.no_compile))
        except Exception as e:  # a problem that cannot run here is a row that says why, not the end of the run
            rows.append({"problem": f"{path.parent.name}/{path.stem}", "error": f"{type(e).__name__}: {e}"[:500]})
        args.out.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
        r = rows[-1]
        floor, best = r.get("floor_ms"), r.get("best_ms")
        log.info("%-40s eager %s compile %s floor %s best %s (%s) %s", r["problem"], r.get("eager_ms"), r.get("compile_ms"),
                 floor, best, r.get("best_label"), f"{100 * floor / best:.1f}% of floor" if floor and best else
                 r.get("error", ""))


if __name__ == "__main__":
    main()
