"""`fusebot eval REFERENCE CANDIDATE`: verify and time one candidate against a reference problem (HELP below is what
`fusebot eval -h` prints; docs/eval.md has the JSON)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from runner.cli.common import (
    Command,
    app,
    choose_backend,
    exit_status_help,
    fail,
    problem_message,
    setup_logging,
    stderr_console,
    stdout_console,
)
from runner.cli.target import parse_target, problem_for
from runner.contract import Candidate, ExitStatus, Timing, Verdict, faster_baseline
from runner.errors import HarnessError, MachineError, ProblemError, UsageError

log = logging.getLogger(__name__)

HELP = """Verify and time one candidate kernel against a reference problem.

REFERENCE is FILE[:CLASS]: a KernelBench file (class Model, get_inputs(), get_init_inputs()) or a module's class
marked `# fusebot: optimize` (CLASS names one where the file marks several). CANDIDATE is a KernelBench ModelNew
(.py), pure CUDA-C (.cu, --backend cuda) or C++ (.cpp, --backend cpu) exporting runner/csrc/fusebot.h's C ABI.

The first line on stdout says whether it is correct and whether it is faster than the faster of eager and
torch.compile (e.g. `correct, 0.01x vs eager: slower`), or which checks rejected it (`rejected at verify:
mismatch`), then each failed check's reason, the trials and the timing.
Diagnostics go to stderr.

""" + exit_status_help()

eval_app = app(HELP)


def candidate_from_file(path: Path, backend: str) -> Candidate:
    """.py: KernelBench format (ModelNew). .cu: fast format, CUDA. .cpp: fast format, CPU backend."""
    text = path.read_text()
    if path.suffix == ".py":
        return Candidate(id=path.stem, format="kernelbench", backend=backend, sources={"candidate.py": text})
    if path.suffix == ".cu":
        return Candidate(id=path.stem, format="fast", backend="cuda", sources={"kernel.cu": text})
    if path.suffix in (".cpp", ".cc"):
        return Candidate(id=path.stem, format="fast", backend="cpu", sources={"kernel.cpp": text})
    raise UsageError(f"{path}: expected .py (KernelBench), .cu (CUDA-C) or .cpp (C++)")


def backend_for(candidate: Path, backend: str | None) -> str:
    """A .cu kernel runs on cuda and a .cpp one on cpu: a --backend that contradicts it is a usage error."""
    implied = {".cu": "cuda", ".cpp": "cpu", ".cc": "cpu"}.get(candidate.suffix)
    if implied and backend and backend != implied:
        raise UsageError(f"{candidate}: a {candidate.suffix} kernel runs on --backend {implied}, not {backend}")
    return choose_backend(backend or implied)


def _ms(t: Timing | None) -> str:
    return "-" if t is None else f"{t.median_ms:.4g}"


def _iqr(t: Timing | None) -> str:
    return "-" if t is None else f"{t.iqr_ms:.3g}"


def _x(speedup: float) -> str:
    return f"{speedup:.2f}x" if speedup >= 0.1 else f"{speedup:.2g}x"


def headline(v: Verdict) -> str:
    """The verdict in words that mean what they say: correct or not, and faster or slower than the faster baseline.

    correct, 2.31x vs eager, 1.12x vs torch.compile: faster
    correct, 0.01x vs eager: slower
    correct, 1.80x vs eager, 0.70x vs torch.compile: slower than torch.compile
    rejected at verify: mismatch, nan-mismatch
    rejected at build: build"""
    if not v.accepted:
        checks = list(dict.fromkeys(r.split(":", 1)[0].strip() for r in v.reasons))
        return f"rejected at {v.stage}" + (f": {', '.join(checks)}" if checks else "")
    speeds = [f"{_x(x)} vs {name}" for x, name in ((v.speedup_vs_eager, "eager"),
                                                      (v.speedup_vs_compile, "torch.compile")) if x is not None]
    best = faster_baseline(v.baselines)
    if v.timing is None or best is None or not speeds:
        return "correct, not timed"
    name, timing = best
    ms = v.timing.median_ms
    beaten = [t for t in (v.baselines.eager, v.baselines.compile) if t is not None and ms < t.median_ms]
    word = "faster" if ms < timing.median_ms else f"slower than {name}" if beaten else "slower"
    return f"correct, {', '.join(speeds)}: {word}"


def render(v: Verdict, console: Console) -> None:
    head = headline(v)
    style = "bold green" if v.accepted and head.endswith(": faster") else "bold yellow" if v.accepted else "bold red"
    console.print(f"[{style}]{head}[/]  (candidate [bold]{v.candidate_id}[/], problem [bold]{v.problem}[/])")
    for r in v.reasons:
        console.print("  x " + r, markup=False)
    for w in v.warnings:
        console.print("  ! " + w, markup=False)
    if v.trials:
        t = Table(title="trials", title_justify="left")
        for col in ("#", "shape", "inputs", "ok", "max abs err", "max rel err", "mismatched"):
            t.add_column(col)
        for tr in v.trials:
            t.add_row(str(tr.index), str(tr.shape_set), tr.distribution, "yes" if tr.passed else "no",
                      "-" if tr.max_abs_err is None else f"{tr.max_abs_err:.3g}",
                      "-" if tr.max_rel_err is None else f"{tr.max_rel_err:.3g}", f"{tr.mismatched}/{tr.numel}")
        console.print(t)
    if v.timing:
        b = v.baselines
        t = Table(title="timing (ms)", title_justify="left")
        for col in ("", "median", "IQR", "n", "speedup"):
            t.add_column(col)
        t.add_row("eager", _ms(b.eager), _iqr(b.eager), str(b.eager.n) if b.eager else "-", "")
        t.add_row("torch.compile", _ms(b.compile), _iqr(b.compile), str(b.compile.n) if b.compile else "-",
                  b.compile_error or "")
        sp = " / ".join(f"{_x(x)} vs {n}" for x, n in ((v.speedup_vs_eager, "eager"),
                                                          (v.speedup_vs_compile, "compile")) if x is not None)
        t.add_row("candidate", _ms(v.timing), _iqr(v.timing), str(v.timing.n), sp)
        console.print(t)
    if v.roofline:
        pct = f", {v.pct_of_floor:.0f}% of it" if v.pct_of_floor is not None else ""
        console.print(f"roofline floor {v.roofline.floor_ms:.4g} ms ({v.roofline.bytes_moved} bytes at "
                      f"{v.roofline.bandwidth_bytes_per_s / 1e9:.0f} GB/s){pct}")
    if v.environment:
        e = v.environment
        where = e.gpu or e.cpu or e.device
        console.print(f"on {where}; torch {e.torch}, CUDA {e.cuda or '-'}, driver {e.driver or '-'}, fusebot {e.fusebot}",
                      markup=False)


@eval_app.command(cls=Command, help=HELP)
def main(
    reference: Annotated[str, typer.Argument(metavar="REFERENCE", show_default=False,
                                             help="The problem: FILE[:CLASS].")],
    candidate: Annotated[Path, typer.Argument(metavar="CANDIDATE", exists=True, dir_okay=False,
                                              help="ModelNew .py, CUDA-C .cu or C++ .cpp.")],
    json_out: Annotated[Path | None, typer.Option("--json", metavar="FILE", help="Write the full verdict as JSON "
                                                  "here.")] = None,
    backend: Annotated[str | None, typer.Option(metavar="cuda|cpu", help="Where the candidate runs (default: the "
                                                "one a .cu/.cpp kernel needs, else cuda where a GPU is "
                                                "present).")] = None,
    compile_baseline: Annotated[bool, typer.Option("--compile/--no-compile", help="Time torch.compile "
                                                   "too.")] = True,
    trials: Annotated[int, typer.Option(min=5, metavar="N", help="Trials on the first shape (at least 5).")] = 5,
    atol: Annotated[float | None, typer.Option(metavar="X", help="Absolute tolerance (default per dtype).")] = None,
    rtol: Annotated[float | None, typer.Option(metavar="X", help="Relative tolerance (default per dtype).")] = None,
    keep: Annotated[bool, typer.Option("--keep", help="Keep the working directories (logs, traces).")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the harness does, and a machine "
                                          "error's details.")] = False,
) -> None:
    from runner.harness.evaluator import Evaluator, HarnessConfig  # (torch: when the command runs, not for --help)

    err = stderr_console()
    setup_logging(verbose, err)
    try:
        chosen = backend_for(candidate, backend)
        cand = candidate_from_file(candidate, chosen)
        spec = problem_for(reference, atol=atol, rtol=rtol)
        cfg = HarnessConfig(trials=trials, compile_baseline=compile_baseline, keep_workdirs=keep)
        with Evaluator(spec, backend=chosen, config=cfg) as ev:
            verdict = ev.evaluate(cand)
            if keep:
                err.print(f"working directories kept under {ev.workdir}", markup=False)
    except UsageError as exc:
        raise fail(str(exc), ExitStatus.USAGE) from None
    except ProblemError as exc:
        raise fail(problem_message(exc, parse_target(reference).path), ExitStatus.USAGE) from None
    except (MachineError, HarnessError) as exc:
        raise fail(f"machine: {exc}", ExitStatus.MACHINE) from None
    render(verdict, stdout_console())
    if json_out:
        json_out.write_text(verdict.model_dump_json(indent=1))
    raise typer.Exit(ExitStatus.OK if verdict.accepted else ExitStatus.REJECTED)


if __name__ == "__main__":
    eval_app(prog_name="fusebot eval")
