"""`fusebot bench SUITE_DIR --out bench/results/NAME`: run `optimize` on every problem of a folder, write a table.

Each problem file (KernelBench format, or a module with one class marked `# fusebot: optimize`) gets its own search
(the builtin catalog unless an LLM is configured) with a per-problem wall budget, and its own result folder under
NAME/problems/. The table, in NAME/README.md and NAME/results.json: problem, pattern, verified (correct), speed (the
confirmation's word), improved, eager ms, torch.compile ms, fusebot ms, speedup against each, % of the roofline floor,
search seconds. A problem that fails to load is a row with its error, not a crash.
A suite can be benched in batches (`--pattern`, or a run killed and started again: each problem's search resumes
from its trace): the table keeps the rows of problems a later run did not redo.
"""

from __future__ import annotations

import json
import logging
import math
import os
import platform
import subprocess
import time
from dataclasses import asdict, dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer

from bot.repo.discovery import MARKER, read_module
from runner.cli.common import (
    Command,
    app,
    choose_backend,
    exit_now,
    exit_status_help,
    fail,
    problem_message,
    setup_logging,
    stderr_console,
)
from runner.cli.target import KERNELBENCH_CLASS, problem_for
from runner.contract import ExitStatus, SearchBudget
from runner.errors import MachineError, ProblemError, UsageError
from runner.search.deadline import Deadline, exit_reserve_s, refuse_budget

log = logging.getLogger(__name__)

HELP = """Run `fusebot optimize` on every problem file of SUITE and write a benchmark table under DIR.

Each file (KernelBench format, or a module with one class marked `# fusebot: optimize`) gets its own search with
the per-problem wall budget and its own result folder, DIR/problems/NAME/. The table is DIR/README.md and
DIR/results.json; it grows as problems finish, and a run killed and started again resumes each problem's search.
A problem that fails to load is a row with its error; a file with nothing marked is a row that says so. Progress
goes to stderr, each problem's outcome to stdout. A broken machine stops the run (exit status 3) after the table.

""" + exit_status_help()

bench_app = app(HELP)


@dataclass
class BenchRow:
    problem: str
    pattern: str = ""
    verified: bool = False  # a candidate was verified correct, whatever its speed
    improved: bool = False
    eager_ms: float | None = None
    compile_ms: float | None = None
    fusebot_ms: float | None = None
    speedup_vs_eager: float | None = None
    speedup_vs_compile: float | None = None
    floor_ms: float | None = None
    pct_of_floor: float | None = None
    search_seconds: float = 0.0
    candidates: int = 0
    best: str = ""
    message: str = ""
    error: str = ""
    machine: bool = False  # the error is the machine's (a dead GPU, a missing compiler), not the problem's
    unmarked: bool = False  # nothing in the file to optimise: neither a marked class nor a KernelBench Model
    speed: str = ""  # the speed verdict of the best (runner.results.choice.SPEED), apart from correctness


def _fmt(x: float | None, spec: str = ".4g", suffix: str = "") -> str:
    return "-" if x is None else f"{x:{spec}}{suffix}"


def geomean(xs: list[float]) -> float | None:
    xs = [x for x in xs if x and x > 0]
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else None


def bench_markdown(rows: list[BenchRow], meta: dict) -> str:
    """The table (pure): one line per problem, then the geometric means over the problems with a verified kernel."""
    from runner.results.choice import SPEED  # (it loads torch: when a table is written, not for --help)

    lines = [f"# fusebot bench: {meta.get('suite', '')}", "",
             f"{meta.get('device', '')}; backend {meta.get('backend', '')}; search budget "
             f"{meta.get('budget_seconds', '')} s per problem; proposer {meta.get('proposer', '')}; "
             f"{meta.get('date', '')}.", "",
             f"torch {meta.get('torch', '')}" + (f", CUDA {meta['cuda']}, driver {meta.get('driver', '')}" if meta.get("cuda")
                                                 else "") + f"; fusebot commit {meta.get('commit', '')[:12]}.", "",
             "| problem | pattern | verified | speed | improved | eager ms | torch.compile ms | fusebot ms | vs eager | "
             "vs compile | % of floor | search s |",
             "| --- | --- | --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        name = r.problem + (" (nothing marked)" if r.unmarked else f" (error: {r.error[:80]})" if r.error else "")
        lines.append(f"| {name} | {r.pattern or '-'} | {'yes' if r.verified else 'no'} | {r.speed or '-'} | "
                     f"{'yes' if r.improved else 'no'} | {_fmt(r.eager_ms)} | {_fmt(r.compile_ms)} | "
                     f"{_fmt(r.fusebot_ms)} | {_fmt(r.speedup_vs_eager, '.2f', 'x')} | "
                     f"{_fmt(r.speedup_vs_compile, '.2f', 'x')} | {_fmt(r.pct_of_floor, '.1f', '%')} | "
                     f"{r.search_seconds:.0f} |")
    ge = geomean([r.speedup_vs_eager for r in rows if r.verified and r.speedup_vs_eager])
    gc = geomean([r.speedup_vs_compile for r in rows if r.verified and r.speedup_vs_compile])
    lines += ["", f"Geometric mean over verified kernels: {_fmt(ge, '.2f', 'x')} vs eager, "
              f"{_fmt(gc, '.2f', 'x')} vs torch.compile. Verified means correct; speed is the confirmation's word "
              "on its time (" + "; ".join(f"{k}: {v}" for k, v in SPEED.items()) + "). A kernel counts as improved "
              "only when it beats the faster of eager and torch.compile; times are harness medians (see each "
              "problem's report.md for n and IQR)."]
    return "\n".join(lines) + "\n"


def _pattern_name(proposers) -> str:
    for p in proposers:
        p = p[0] if isinstance(p, tuple) else p
        pats = getattr(p, "_patterns", None)
        if pats:
            pat = next(reversed(pats.values()))
            return pat.family + (f" ({pat.reason[:60]})" if pat.family == "unsupported" else "")
    return ""


def run_problem(path: Path, out: Path, budget: SearchBudget, backend: str, compile_baseline: bool,
                bandwidth: float | None, fresh: bool, devices: list[int] | None = None) -> BenchRow:
    row = BenchRow(problem=path.stem)
    if nothing_marked(path):
        row.unmarked, row.error = True, f"nothing marked in {path.name}"
        return row
    try:
        spec = problem_for(str(path))
    except UsageError as e:
        row.error = str(e)
        return row
    from runner.harness.evaluator import HarnessConfig  # (torch and the harness: when a problem runs, not for --help)
    from runner.harness.gpus import device_evaluators  # torch: when a problem runs
    from runner.pipeline import make_proposers, optimize_problem  # torch: when a problem runs

    proposers = make_proposers([])
    cfg = HarnessConfig(compile_baseline=compile_baseline, bandwidth_bytes_per_s=bandwidth)
    t0 = time.monotonic()
    deadline = Deadline(budget.wall_seconds, start_s=t0)  # the evaluator's start and close within the problem's budget
    try:
        with device_evaluators(spec, backend, devices or [], cfg) as ev:  # every GPU in `devices` at once
            o = optimize_problem(spec, out, budget, proposers, ev, backend, fresh=fresh,  # type: ignore[arg-type]
                                 deadline=deadline, reserve_s=exit_reserve_s(budget.wall_seconds))
    except ProblemError as e:
        row.error = problem_message(e, path)
        row.search_seconds = time.monotonic() - t0
        return row
    except MachineError as e:
        row.error, row.machine = f"machine: {e}", True
        row.search_seconds = time.monotonic() - t0
        return row
    row.pattern = _pattern_name(proposers)
    b = o.baselines
    row.eager_ms = b.eager.median_ms if b and b.eager else None
    row.compile_ms = b.compile.median_ms if b and b.compile else None
    row.floor_ms = o.roofline.floor_ms if o.roofline else None
    row.search_seconds, row.candidates, row.message, row.improved = o.wall_seconds, o.candidates, o.message, o.improved
    row.speed = o.speed
    # correct is one thing, proven faster another: the best's own time, else (its confirmation refused a figure)
    # the fastest verified candidate's time in the search
    timed = [a for a in ([o.best] if o.best is not None and o.best.median_ms is not None else o.attempts)
             if a.median_ms is not None]
    if timed:
        fastest = min(timed, key=lambda a: a.median_ms)
        row.verified = True
        row.fusebot_ms = fastest.median_ms
        row.best = fastest.candidate.id if fastest.candidate else ""
        row.speedup_vs_eager = row.eager_ms / row.fusebot_ms if row.eager_ms else None
        row.speedup_vs_compile = row.compile_ms / row.fusebot_ms if row.compile_ms else None
        row.pct_of_floor = 100.0 * row.floor_ms / row.fusebot_ms if row.floor_ms else None
    return row


def nothing_marked(path: Path) -> bool:
    """A file of the folder with no class marked `# fusebot: optimize` and no KernelBench `Model`: nothing to search
    (a file that does not parse is the user's to fix, and problem_for says where)."""
    try:
        module = read_module(path.read_text(errors="replace"))
    except SyntaxError:
        return False
    return not module.marked and KERNELBENCH_CLASS not in module.classes


def outcome_line(name: str, row: BenchRow) -> str:
    """What became of one file: searched (improved or not), nothing to search in it, or why it could not be."""
    if row.unmarked:
        return f"nothing marked in {name}: no class marked `{MARKER}` and no class {KERNELBENCH_CLASS!r}"
    if row.error:
        return f"{name}: error: {row.error.splitlines()[0]}"
    return f"{name}: {'improved' if row.improved else 'no improvement'}: {row.message}"


def earlier_rows(out: Path) -> list[BenchRow]:
    """Rows an earlier run left in out/results.json (a suite benched in batches keeps one table)."""
    path = out / "results.json"
    if not path.exists():
        return []
    try:
        return [BenchRow(**r) for r in json.loads(path.read_text()).get("rows", [])]
    except (ValueError, TypeError) as e:
        log.warning("ignoring %s: %s", path, e)
        return []


def write_table(out: Path, rows: list[BenchRow], meta: dict) -> None:
    """results.json and README.md: this run's rows, plus earlier rows of problems this run did not redo."""
    out.mkdir(parents=True, exist_ok=True)
    mine = {r.problem for r in rows}
    merged = sorted([r for r in earlier_rows(out) if r.problem not in mine] + rows, key=lambda r: r.problem)
    (out / "results.json").write_text(json.dumps({**meta, "rows": [asdict(r) for r in merged]}, indent=1))
    (out / "README.md").write_text(bench_markdown(merged, meta))


@bench_app.command(cls=Command, help=HELP)
def bench(
    suite: Annotated[Path, typer.Argument(metavar="SUITE", show_default=False, help="A folder of problem files.")],
    out: Annotated[Path, typer.Option("--out", "-o", metavar="DIR", help="Where the table and each problem's "
                                      "results go.")],
    budget_seconds: Annotated[float, typer.Option(metavar="S", help="Budget per problem, in seconds from its start "
                                                  "to its result folder: capture, baselines, search and "
                                                  "confirmation all end within it.")] = 300.0,
    rounds: Annotated[int, typer.Option(min=1, metavar="N", help="Search rounds per problem.")] = 3,
    ideas: Annotated[int, typer.Option(min=1, metavar="N", help="Ideas per round.")] = 4,
    implementations: Annotated[int, typer.Option(min=1, metavar="N", help="Implementations per idea.")] = 2,
    pattern: Annotated[str, typer.Option(metavar="GLOB", help="Which files of the folder: a glob, or several "
                                         "joined by commas.")] = "*.py",
    backend: Annotated[str | None, typer.Option(metavar="cuda|cpu", help="Where kernels run (default: cuda where "
                                                "a GPU is present).")] = None,
    no_compile_baseline: Annotated[bool, typer.Option("--no-compile-baseline",
                                                      help="Skip the torch.compile baseline.")] = False,
    bandwidth: Annotated[float | None, typer.Option(metavar="BYTES_PER_S", help="Known copy bandwidth (3.01e12 on "
                                                    "the H100).")] = None,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard earlier traces instead of resuming them.")] = False,
    gpus: Annotated[str | None, typer.Option("--gpus", envvar="FUSEBOT_GPUS", metavar="all|0,1", help="The GPUs "
                                             "each search evaluates candidates on at once (default: all).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what each search does.")] = False,
) -> None:
    console = stderr_console()
    setup_logging(verbose, console)
    if not suite.is_dir():
        hint = f": `fusebot optimize {suite} --out DIR` searches one file" if suite.is_file() else ""
        raise fail(f"{suite}: not a folder{hint}", ExitStatus.USAGE)
    refused = refuse_budget(budget_seconds, "--budget-seconds")
    if refused:
        raise fail(refused, ExitStatus.USAGE)
    from runner.harness.gpus import parse_gpus, visible_gpus  # torch: when the command runs, not for --help

    try:
        chosen = choose_backend(backend)
        devices = parse_gpus(gpus, visible_gpus()) if chosen == "cuda" else []
    except UsageError as e:
        raise fail(str(e), ExitStatus.USAGE) from None
    files = sorted({p for g in pattern.split(",") if g.strip() for p in suite.glob(g.strip())
                    if p.is_file() and not p.name.startswith("_")})
    if not files:
        raise fail(f"{suite}: no problem files match {pattern}", ExitStatus.USAGE)
    budget = SearchBudget(rounds=rounds, ideas_per_round=ideas, implementations_per_idea=implementations,
                          wall_seconds=budget_seconds)
    meta = {"suite": str(suite), "backend": chosen, "budget_seconds": budget_seconds,
            "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"), "device": _device(chosen),
            "proposer": "builtin catalog" if not _llm_configured() else "LLM", "budget": budget.model_dump(),
            **_versions(chosen)}
    rows: list[BenchRow] = []
    for k, f in enumerate(files, 1):
        console.print(f"[{k}/{len(files)}] {f.name} ...", markup=False)
        row = run_problem(f, out / "problems" / f.stem, budget, chosen, not no_compile_baseline, bandwidth, fresh,
                          devices)
        rows.append(row)
        write_table(out, rows, meta)  # the table grows as problems finish
        typer.echo(outcome_line(f.name, row))
        if row.machine:
            typer.echo(f"table in {out}/README.md and {out}/results.json (up to {f.name})")
            raise fail(row.error, ExitStatus.MACHINE)
    typer.echo(f"table in {out}/README.md and {out}/results.json")
    exit_now(0)  # every table is written and every process closed: torch's teardown is not the budget's


def _versions(backend: str) -> dict[str, str]:
    """What a table must name besides the device: torch, CUDA and the driver, and fusebot's commit."""
    import torch

    out = {"torch": torch.__version__, "commit": _git(["rev-parse", "HEAD"])}
    if backend == "cuda":
        out["cuda"] = torch.version.cuda or ""
        drivers = _run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"]).splitlines()
        out["driver"] = drivers[0] if drivers else ""
    return out


def _run(cmd: list[str]) -> str:
    try:
        return subprocess.run(cmd, capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return ""


def _git(args: list[str]) -> str:
    return _run(["git", "-C", str(Path(__file__).resolve().parents[2]), *args])


def _llm_configured() -> bool:
    return bool(os.environ.get("FUSEBOT_LLM_BASE_URL"))


def _device(backend: str) -> str:
    if backend == "cuda":
        import torch

        try:
            return torch.cuda.get_device_name(0)
        except Exception:  # noqa: BLE001 - a description only
            return "cuda"
    return f"CPU {platform.processor() or platform.machine()}"


if __name__ == "__main__":
    bench_app(prog_name="fusebot bench")
