"""`fusebot optimize PROBLEM.py --out DIR`: search for a faster kernel and write the result folder.

DIR receives trace.jsonl (written as the search runs; running the same command again resumes from it), report.md,
result.json and, when a verified kernel beats the faster of eager and torch.compile, the kernel source, fusebot.h,
the drop-in module (dropin.py), its test (test_dropin.py) and, for a KernelBench-format problem, reference.py.
Exit status: 0 when the search ran (improved or not: result.json says which), 1 when the problem or the machine is
broken, 2 on a usage or configuration error.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.live import Live
from rich.text import Text

from runner.contract import Backend, Progress, SearchBudget
from runner.errors import MachineError, ProblemError, UsageError
from runner.harness.evaluator import Evaluator, default_backend
from runner.pipeline import make_proposers, optimize_problem, problem_from_file

log = logging.getLogger(__name__)

optimize_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                           help="Search for a faster fused kernel for one problem and write the result folder.")

class ProgressView:
    """A live line: round, candidates built / verified / rejected, best speedup over the faster baseline."""

    def __init__(self, console: Console, rounds: int):
        self.rounds = rounds
        self.live = Live(self.render(Progress()), console=console, refresh_per_second=4)

    def render(self, p: Progress) -> Text:
        best = f"{p.best_speedup:.2f}x" if p.best_speedup is not None else "-"
        text = Text.assemble(("fusebot ", "bold"), f"round {p.round}/{self.rounds}  built {p.built}  ",
                             (f"verified {p.verified}", "green"), "  ", (f"rejected {p.rejected}", "red"),
                             "  best ", (best, "bold cyan"))
        if p.message:
            text.append(f"  ({p.message})")
        return text

    def __call__(self, p: Progress) -> None:
        self.live.update(self.render(p))


@optimize_app.command()
def optimize(
    problem: Annotated[Path, typer.Argument(help="A KernelBench-format file: Model, get_inputs, get_init_inputs.")],
    out: Annotated[Path, typer.Option("--out", "-o", help="The result folder (also holds the resumable trace).")],
    rounds: Annotated[int, typer.Option(min=1)] = 3,
    ideas: Annotated[int, typer.Option(min=1, help="Ideas per round, split among the models by share.")] = 4,
    implementations: Annotated[int, typer.Option(min=1, help="Implementations per idea.")] = 2,
    beam: Annotated[int, typer.Option(min=1, help="Best verified kernels shown to the next round.")] = 3,
    max_repairs: Annotated[int, typer.Option(min=0, help="Repairs of a rejected candidate.")] = 2,
    wall_seconds: Annotated[float, typer.Option(help="Budget: wall-clock seconds.")] = 1800.0,
    gpu_seconds: Annotated[float | None, typer.Option(help="Budget: seconds spent in the harness.")] = None,
    tokens: Annotated[int | None, typer.Option(help="Budget: LLM tokens (prompt + completion).")] = None,
    candidates: Annotated[int | None, typer.Option(help="Budget: candidates evaluated.")] = None,
    model: Annotated[list[str] | None, typer.Option("--model", "-m", help="NAME[:SHARE], repeatable; overrides "
                                                    "FUSEBOT_LLM_MODELS.")] = None,
    backend: Annotated[str | None, typer.Option(help="cuda or cpu (default: cuda where available).")] = None,
    no_compile_baseline: Annotated[bool, typer.Option("--no-compile-baseline",
                                                      help="Skip the torch.compile baseline.")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard DIR's trace instead of resuming it.")] = False,
    verbose: Annotated[bool, typer.Option("--verbose", "-v")] = False,
) -> None:
    console = Console(stderr=True)
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")

    if backend not in (None, "cuda", "cpu"):
        console.print(f"[red]--backend must be cuda or cpu, not {backend!r}[/red]")
        raise typer.Exit(2)
    if not problem.is_file():
        console.print(f"[red]{problem}: no such file[/red]")
        raise typer.Exit(2)
    chosen: Backend = backend or default_backend()  # type: ignore[assignment]
    budget = SearchBudget(rounds=rounds, ideas_per_round=ideas, implementations_per_idea=implementations, beam=beam,
                          max_repairs=max_repairs, wall_seconds=wall_seconds, gpu_seconds=gpu_seconds, tokens=tokens,
                          candidates=candidates)
    spec = problem_from_file(problem)
    try:
        proposers = make_proposers(model or [])
        with Evaluator(spec, backend=chosen, compile_baseline=not no_compile_baseline) as ev:
            view = ProgressView(console, rounds)
            with view.live:
                o = optimize_problem(spec, out, budget, proposers, ev, chosen, fresh=fresh, progress=view)
    except UsageError as e:
        console.print(f"[red]{e}[/red]")
        raise typer.Exit(2) from None
    except (ProblemError, MachineError) as e:
        console.print(f"[red]{type(e).__name__}: {e}[/red]")
        raise typer.Exit(1) from None
    console.print(("[green]improved[/green]: " if o.improved else "[yellow]no improvement[/yellow]: ") + o.message)
    console.print(f"results in {out}/ (report.md, result.json{', dropin.py' if o.improved else ''})")


if __name__ == "__main__":
    optimize_app()
