"""The catalog's generated kernels on real-world problems against the memory floor: many problems in one run.

For each problem: eager and torch.compile as the harness times them, the floor (bytes moved / the device's copy
rate, the harness's roofline) and the first parameter set of each of the catalog's first `--strategies` strategies,
each built, verified against the float64 oracle and timed by the harness (no search).

Two stages, so that the GPU never waits on a compiler and never runs two measurements at once:

- prepare (a pool of `--jobs` processes, every problem in the order given): capture and recognise the problem,
  render its candidates and build each fast-format one into the harness's own build cache (runner/harness/build.py:
  keyed by the sources, flags, compiler and target), so the evaluator's build of the same candidate is a cache hit.
  On CUDA the pool works ahead while the GPU measures (as the harness's own prebuilds do); on the CPU backend every
  problem is prepared before the first measurement, so no compiler runs beside a CPU timing.
- measure (this process, one problem at a time, in the order given): an Evaluator per problem, its baselines,
  roofline and evaluate_many; every number is the harness's.

Rows are written to `--out` (JSON) as each problem finishes, so a run cut short keeps what it measured. No problem
starts after `--deadline-s`, nor when less time is left than the median problem took so far; at the deadline the
candidates in flight are cut off (their verdicts say so, the row keeps what was timed). A one-line-per-problem table
goes to the log at the end.

    python bench/realworld_floor.py --jobs 12 --deadline-s 480 --out rows.json bench/suites/realworld/fp32 ...

Files are taken in the order given, then the problems of every folder given: FIRST's first, in its order, then the
others by name. `bench/realworld_floor.sh` runs it for the tree it is in and for the repository root's tree (before and
after a change), then `bench/realworld_table.py` writes the tables.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import logging
import multiprocessing
import os
import statistics
import subprocess
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import Executor, Future, ProcessPoolExecutor
from pathlib import Path

from runner.catalog.codegen.common import NotExpressible
from runner.catalog.codegen.cuda import CudaParams
from runner.harness import build as builder
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import problem_from_file
from runner.proposers.catalog import CatalogProposer, label_of
from runner.search.types import ProblemContext

log = logging.getLogger("realworld_floor")

# The rows measured first where a folder is given: the modules the floor work was measured on (causal softmax, RoPE,
# bf16 softmax in fp32, LlamaRMSNorm, tanh-GELU, cross-entropy, LayerNorm, GroupNorm + SiLU, masked mean pooling),
# then the timm, torchvision and diffusers modules and the losses never measured on a GPU.
FIRST = ("fp32/gpt2_causal_softmax", "fp32/llama_rope", "bf16/llama_causal_softmax_fp32", "bf16/llama_rmsnorm",
         "bf16/gelu_pytorch_tanh", "fp32/llama_causal_lm_loss", "fp32/bert_residual_layernorm",
         "fp32/diffusers_groupnorm_silu", "fp32/masked_mean_pooling",
         "bf16/diffusers_flux_rope", "bf16/diffusers_fp32_layernorm", "fp32/bert_masked_lm_loss",
         "fp32/timm_layernorm2d", "fp32/timm_global_response_norm", "fp32/torchvision_frozen_batchnorm",
         "fp32/torchvision_sigmoid_focal_loss", "bf16/diffusers_adaln_zero",
         "bf16/t5_position_bias_softmax", "fp32/gpt2_lm_loss", "fp32/t5_layernorm", "bf16/gptj_interleaved_rope",
         "bf16/diffusers_groupnorm_silu")


def problem_key(path: Path) -> str:
    return f"{path.parent.name}/{path.stem}"


def ordered(paths: Iterable[Path], first: tuple[str, ...] = FIRST) -> list[Path]:
    """Files in the order given, then every given folder's problems together: FIRST's, in its order, then the
    others by name (a module's dtypes side by side, in the folders' order). Duplicates dropped."""
    files = [p for p in paths if not p.is_dir()]
    folders = [p for p in paths if p.is_dir()]
    rank = {k: i for i, k in enumerate(first)}
    found = [(f, k) for k, d in enumerate(folders) for f in sorted(d.glob("*.py"))]
    found.sort(key=lambda fk: (rank.get(problem_key(fk[0]), len(rank)), fk[0].stem, fk[1]))
    return list(dict.fromkeys([*files, *(f for f, _ in found)]))


def parse_also(text: str) -> dict[str, object]:
    """`buffers=1,fast_math=true`: CudaParams fields to replace, typed as the dataclass types them."""
    types = {f.name: f.type for f in dataclasses.fields(CudaParams)}
    kw: dict[str, object] = {}
    for item in text.split(","):
        key, _, value = item.partition("=")
        if key not in types:
            raise SystemExit(f"--also: no field {key!r} (fields: {', '.join(types)})")
        kw[key] = value == "true" if types[key] == "bool" else int(value) if types[key] == "int" else value
    return kw


def candidates(path: Path, backend: str, strategies: int, also: tuple[dict, ...] = ()) -> list:
    """The first parameter set of each of the catalog's first `strategies` strategies that renders; after each, its
    variants with the fields of each of `also` replaced, where one renders under another label (another kernel)."""
    prop = CatalogProposer()
    ctx = ProblemContext(name=path.stem, reference_source=path.read_text(), backend=backend)
    pat = prop.pattern(ctx)
    out = []
    for s in prop.strategies(ctx)[:strategies]:
        for p in s.params[:3]:
            try:
                out.append(prop.candidate(ctx, pat, p))
            except NotExpressible:
                continue
            for kw in also if isinstance(p, CudaParams) else ():
                q = dataclasses.replace(p, **kw)
                if q.label() == p.label():
                    continue
                try:
                    out.append(prop.candidate(ctx, pat, q))
                except NotExpressible:
                    pass
            break
    return out


def prepare(path: Path, backend: str, strategies: int, cuda_arch: str | None, cache_dir: Path,
            also: tuple[dict, ...] = ()) -> dict:
    """In a pool process: the problem's candidates, each fast-format one built into the harness's build cache (the
    evaluator's own build of it is then a cache hit). Never raises: a problem that cannot be prepared says why."""
    t0 = time.monotonic()
    try:
        cands = candidates(path, backend, strategies, also)
        # one compiler per candidate: the first problems are ready sooner, so the device waits less at the start
        outs = builder.build_many(cands, cuda_arch=cuda_arch, cache_dir=cache_dir / "build", jobs=max(1, len(cands)))
        built = {cid: out.info.ok for cid, out in outs.items()}
        return {"candidates": cands, "built": built, "prepare_s": time.monotonic() - t0}
    except Exception as e:  # noqa: BLE001 - a problem that cannot be captured is a row that says why
        return {"candidates": [], "built": {}, "prepare_s": time.monotonic() - t0,
                "error": f"prepare: {type(e).__name__}: {e}"[:500]}


class Deadline:
    """Cuts off the evaluator in flight once `at` (a monotonic time) has passed, from a watchdog thread."""

    def __init__(self, at: float | None, clock: Callable[[], float] = time.monotonic) -> None:
        self.at, self.clock = at, clock
        self._ev: Evaluator | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        if at is not None:
            self._thread = threading.Thread(target=self._watch, name="deadline", daemon=True)
            self._thread.start()

    def passed(self) -> bool:
        return self.at is not None and self.clock() >= self.at

    def left_s(self) -> float:
        return float("inf") if self.at is None else self.at - self.clock()

    def watch(self, ev: Evaluator | None) -> None:
        with self._lock:
            self._ev = ev

    def _watch(self) -> None:
        while not self._stop.wait(0.5):
            if self.passed():
                with self._lock:
                    if self._ev is not None:  # again every half second: an evaluate_many begun since is cut too
                        self._ev.abort()

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)


def measure(path: Path, prep: dict, backend: str, config: HarnessConfig, deadline: Deadline) -> dict:
    """One problem on the device: the harness's baselines, roofline and verdicts for the prepared candidates."""
    row: dict = {"problem": problem_key(path), "prepare_s": prep.get("prepare_s")}
    if prep.get("error"):
        row["prepare_error"] = prep["error"]
    cands = prep["candidates"]
    t0 = time.monotonic()
    stages: dict[str, float] = {}
    with Evaluator(problem_from_file(path), backend=backend, config=config) as ev:
        deadline.watch(ev)
        try:
            t = time.monotonic()
            base = ev.baselines()
            stages["baselines_s"] = time.monotonic() - t
            t = time.monotonic()
            roof = ev.roofline()
            stages["roofline_s"] = time.monotonic() - t
            row["eager_ms"] = base.eager.median_ms if base.eager else None
            row["compile_ms"] = base.compile.median_ms if base.compile else None
            row["compile_error"] = base.compile_error
            row["floor_ms"] = roof.floor_ms if roof else None
            row["bytes_moved"] = roof.bytes_moved if roof else None
            row["bandwidth_bytes_per_s"] = roof.bandwidth_bytes_per_s if roof else None
            t = time.monotonic()
            if cands and deadline.passed():
                verdicts = []
                row["error"] = "deadline: its candidates were not evaluated"
            else:
                verdicts = ev.evaluate_many(cands) if cands else []
            stages["candidates_s"] = time.monotonic() - t
        finally:
            deadline.watch(None)
    row["candidates"] = [{"label": label_of(c), "accepted": v.accepted,
                          "median_ms": v.timing.median_ms if v.accepted and v.timing else None,
                          "build_cached": v.build.cached if v.build else None,
                          "stage_s": v.stage_seconds,
                          "reason": "; ".join(v.reasons)[:300]} for c, v in zip(cands, verdicts, strict=False)]
    ok = [c for c in row["candidates"] if c["median_ms"]]
    best = min(ok, key=lambda c: c["median_ms"]) if ok else None
    row["best_label"], row["best_ms"] = (best["label"], best["median_ms"]) if best else (None, None)
    row["stage_s"] = stages
    row["seconds"] = time.monotonic() - t0
    return row


def run(paths: list[Path], *, prepare_one: Callable[[Path], dict], measure_one: Callable[[Path, dict], dict],
        pool: Executor, ahead: bool, deadline: Deadline, on_row: Callable[[dict], None]) -> list[dict]:
    """Prepare every problem in `pool` (submitted in order), measure them one at a time in order. With `ahead`
    False, nothing is measured until every problem is prepared. Each row goes to `on_row` as it is made."""
    futures: list[Future] = [pool.submit(prepare_one, p) for p in paths]
    if not ahead:
        for f in futures:
            f.exception()  # wait (prepare never raises; a crashed pool process shows at its result below)
    rows: list[dict] = []
    took: list[float] = []
    for path, fut in zip(paths, futures, strict=True):
        left = deadline.left_s()
        if left <= 0 or (took and left < statistics.median(took)):
            log.warning("deadline: %s not measured (%.0f s left)", path, max(left, 0))
            for f in futures:
                f.cancel()
            break
        try:
            prep = fut.result()
        except Exception as e:  # noqa: BLE001 - a pool process that died: this problem's row says so
            prep = {"candidates": [], "built": {}, "error": f"prepare: {type(e).__name__}: {e}"[:500]}
        busy = sum(not f.done() for f in futures)
        t0 = deadline.clock()
        try:
            row = measure_one(path, prep)
        except Exception as e:  # a problem that cannot run here is a row that says why, not the end of the run
            row = {"problem": problem_key(path), "error": f"{type(e).__name__}: {e}"[:500]}
        took.append(deadline.clock() - t0)
        row["preparing_meanwhile"] = busy  # problems still being prepared (compilers busy) when it began
        rows.append(row)
        on_row(row)
    return rows


def table(rows: list[dict]) -> list[str]:
    """One line per problem: floor, torch.compile, the best verified candidate, its % of the floor, best vs
    compile."""
    def num(x):
        return f"{x:.4g}" if x else "-"

    out = [f"{'problem':<44} {'floor_ms':>9} {'compile_ms':>10} {'best_ms':>9} {'% floor':>8} {'vs compile':>10}  "
           "best kernel or why none"]
    for r in rows:
        floor, comp, best = r.get("floor_ms"), r.get("compile_ms"), r.get("best_ms")
        pct = f"{100 * floor / best:.1f}%" if floor and best else "-"
        vs = f"{comp / best:.2f}x" if comp and best else "-"
        why = r.get("best_label") or r.get("error") or r.get("prepare_error") or next(
            (c["reason"][:80] for c in r.get("candidates", []) if c["reason"]), "no candidate")
        out.append(f"{r['problem']:<44} {num(floor):>9} {num(comp):>10} {num(best):>9} {pct:>8} {vs:>10}  {why}")
    return out


def commit() -> str:
    """FUSEBOT_COMMIT where set (the GPU machine's copy of the tree may carry a stale .git), else HEAD."""
    if os.environ.get("FUSEBOT_COMMIT"):
        return os.environ["FUSEBOT_COMMIT"]
    try:
        return subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=10).stdout.strip()
    except OSError:
        return ""


def write(out: Path, env: dict, rows: list[dict]) -> None:
    tmp = out.with_name(f".{out.name}.tmp")
    tmp.write_text(json.dumps({"environment": env, "rows": rows}, indent=1))
    os.replace(tmp, out)  # whole or not at all: a run killed mid-write keeps the rows before


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("problems", nargs="+", type=Path, help="problem files, or folders of them")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--label", default="")
    ap.add_argument("--backend", default="cuda")
    ap.add_argument("--strategies", type=int, default=4)
    ap.add_argument("--also", action="append", default=[], metavar="FIELD=VALUE,...",
                    help="also each first parameter set with these CudaParams fields replaced (e.g. buffers=1: the "
                    "regs kernel without its next row loaded ahead), where that is another kernel; repeatable")
    ap.add_argument("--no-compile", action="store_true", help="skip the torch.compile baseline")
    ap.add_argument("--deadline-s", type=float, default=0, help="start no problem after this many seconds, and cut "
                    "off the candidates in flight then")
    ap.add_argument("--jobs", type=int, default=max(1, (os.cpu_count() or 2) - 4),
                    help="processes preparing problems (capture, render, build)")
    ap.add_argument("--cache-dir", type=Path, default=None, help="the harness's cache (default: FUSEBOT_CACHE_DIR)")
    ap.add_argument("--batches", action="store_true", help="also log every parent-clocked batch of the timer's cross-"
                    "check (wall and CPU ms of each of the candidate's batches and of the judge's steps)")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    if args.batches:
        logging.getLogger("runner.harness.measure").setLevel(logging.DEBUG)
    import torch

    t_start = time.monotonic()
    paths = ordered(args.problems)
    cache = Path(args.cache_dir or builder.default_cache_dir().parent)
    cuda = args.backend == "cuda"
    arch = None
    if cuda:
        major, minor = torch.cuda.get_device_capability()
        arch = f"sm_{major}{minor}"
    env = {"label": args.label, "commit": commit(), "torch": torch.__version__, "jobs": args.jobs,
           "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None}
    config = HarnessConfig(compile_baseline=not args.no_compile, cache_dir=cache)
    deadline = Deadline(t_start + args.deadline_s if args.deadline_s else None)
    rows: list[dict] = []

    def on_row(r: dict) -> None:
        rows.append(r)
        write(args.out, env, rows)
        floor, best = r.get("floor_ms"), r.get("best_ms")
        log.info("%-40s %.0f s: eager %s compile %s floor %s best %s (%s) %s", r["problem"], r.get("seconds", 0),
                 r.get("eager_ms"), r.get("compile_ms"), floor, best, r.get("best_label"),
                 f"{100 * floor / best:.1f}% of floor" if floor and best else r.get("error", ""))

    pool = ProcessPoolExecutor(max(1, args.jobs), mp_context=multiprocessing.get_context("spawn"))
    try:
        run(paths, prepare_one=_Prepare(args.backend, args.strategies, arch, cache,
                                        tuple(parse_also(a) for a in args.also)),
            measure_one=lambda p, prep: measure(p, prep, args.backend, config, deadline),
            pool=pool, ahead=cuda, deadline=deadline, on_row=on_row)
    finally:
        deadline.close()
        pool.shutdown(wait=False, cancel_futures=True)
    write(args.out, env, rows)
    measured = {r["problem"] for r in rows}
    missed = [problem_key(p) for p in paths if problem_key(p) not in measured]
    log.info("%d of %d problems measured in %.0f s%s", len(rows), len(paths), time.monotonic() - t_start,
             f"; not reached: {' '.join(missed)}" if missed else "")
    log.info("\n".join(["", *table(rows)]))


class _Prepare:
    """prepare() with the run's settings, picklable for the pool's processes."""

    def __init__(self, backend: str, strategies: int, cuda_arch: str | None, cache_dir: Path,
                 also: tuple[dict, ...] = ()) -> None:
        self.backend, self.strategies, self.cuda_arch, self.cache_dir = backend, strategies, cuda_arch, cache_dir
        self.also = also

    def __call__(self, path: Path) -> dict:
        return prepare(path, self.backend, self.strategies, self.cuda_arch, self.cache_dir, self.also)


if __name__ == "__main__":
    main()
