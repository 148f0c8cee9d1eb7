"""`fusebot eval`: verify and time one candidate against a reference problem.

Exit status: 0 accepted, 1 rejected, 2 usage error or broken problem, 3 broken machine (no GPU, no compiler...).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from runner.contract import Candidate, Timing, Verdict
from runner.errors import HarnessError, MachineError, ProblemError
from runner.harness.evaluator import Evaluator, HarnessConfig, default_backend
from runner.pipeline import problem_from_file

log = logging.getLogger(__name__)

eval_app = typer.Typer(add_completion=False, help=__doc__)

EXIT_ACCEPTED, EXIT_REJECTED, EXIT_USAGE, EXIT_MACHINE = 0, 1, 2, 3


def candidate_from_file(path: Path, backend: str) -> Candidate:
    """.py: KernelBench format (ModelNew). .cu: fast format, CUDA. .cpp: fast format, CPU backend."""
    text = path.read_text()
    if path.suffix == ".py":
        return Candidate(id=path.stem, format="kernelbench", backend=backend, sources={"candidate.py": text})
    if path.suffix == ".cu":
        return Candidate(id=path.stem, format="fast", backend="cuda", sources={"kernel.cu": text})
    if path.suffix in (".cpp", ".cc"):
        return Candidate(id=path.stem, format="fast", backend="cpu", sources={"kernel.cpp": text})
    raise typer.BadParameter(f"{path.name}: expected .py (KernelBench), .cu (CUDA-C) or .cpp (C++)")


def _ms(t: Timing | None) -> str:
    return "-" if t is None else f"{t.median_ms:.4g}"


def _iqr(t: Timing | None) -> str:
    return "-" if t is None else f"{t.iqr_ms:.3g}"


def render(v: Verdict, console: Console) -> None:
    head = "[bold green]ACCEPTED[/]" if v.accepted else f"[bold red]REJECTED[/] at {v.stage}"
    console.print(f"{head}  candidate [bold]{v.candidate_id}[/] for problem [bold]{v.problem}[/]")
    for r in v.reasons:
        console.print(f"  [red]x[/] {r}")
    for w in v.warnings:
        console.print(f"  [yellow]![/] {w}")
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
        sp = " / ".join(f"{x:.2f}x vs {n}" for x, n in ((v.speedup_vs_eager, "eager"),
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
        console.print(f"on {where}; torch {e.torch}, CUDA {e.cuda or '-'}, driver {e.driver or '-'}, fusebot {e.fusebot}")


@eval_app.command()
def main(
    reference: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="KernelBench-format problem file.")],
    candidate: Annotated[Path, typer.Argument(exists=True, dir_okay=False, help="ModelNew .py, CUDA-C .cu or C++ .cpp")],
    json_out: Annotated[Path | None, typer.Option("--json", help="Write the full verdict as JSON here.")] = None,
    backend: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda if a GPU is present).")] = None,
    compile_baseline: Annotated[bool, typer.Option("--compile/--no-compile", help="Time torch.compile too.")] = True,
    trials: Annotated[int, typer.Option(min=5, help="Trials on the first shape (at least 5).")] = 5,
    atol: Annotated[float | None, typer.Option(help="Absolute tolerance (default per dtype).")] = None,
    rtol: Annotated[float | None, typer.Option(help="Relative tolerance (default per dtype).")] = None,
    keep: Annotated[bool, typer.Option(help="Keep the working directories (logs, traces).")] = False,
) -> None:
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
    console = Console()
    if candidate.suffix == ".cpp":
        backend = backend or "cpu"
    backend = backend or default_backend()
    if backend not in ("cuda", "cpu"):
        raise typer.BadParameter("backend must be cuda or cpu")
    try:
        cand = candidate_from_file(candidate, backend)
        spec = problem_from_file(reference, atol=atol, rtol=rtol)
        cfg = HarnessConfig(trials=trials, compile_baseline=compile_baseline, keep_workdirs=keep)
        with Evaluator(spec, backend=backend, config=cfg) as ev:
            verdict = ev.evaluate(cand)
            if keep:
                console.print(f"working directories kept under {ev.workdir}")
    except ProblemError as exc:
        console.print(f"[red]problem error[/] {exc}")
        sys.exit(EXIT_USAGE)
    except MachineError as exc:
        console.print(f"[red]machine error[/] {exc}")
        sys.exit(EXIT_MACHINE)
    except HarnessError as exc:
        console.print(f"[red]harness error[/] {exc}")
        sys.exit(EXIT_MACHINE)
    render(verdict, console)
    if json_out:
        json_out.write_text(verdict.model_dump_json(indent=1))
    sys.exit(EXIT_ACCEPTED if verdict.accepted else EXIT_REJECTED)

