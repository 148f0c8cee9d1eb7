"""`fusebot optimize FILE[:CLASS] --out DIR`: search for a faster fused kernel for one module and write the result
folder (HELP below is the whole story, as `fusebot optimize -h` prints it)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Annotated

import typer

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
from runner.cli.progress import ProgressView
from runner.cli.target import parse_target, problem_for
from runner.contract import Backend, ExitStatus, SearchBudget
from runner.errors import MachineError, ProblemError, UsageError
from runner.search.deadline import Deadline, exit_reserve_s, process_start_s, refuse_budget

log = logging.getLogger(__name__)

HELP = """Search for a faster fused kernel for one module and write the result folder DIR.

FILE[:CLASS] is a module with its example inputs: the class marked `# fusebot: optimize` (CLASS names one where the
file marks several, or any other class), or a KernelBench file (class Model, get_inputs(), get_init_inputs()).

DIR gets trace.jsonl (the same command again resumes from it), report.md, result.json and, when a verified kernel
beats the faster of eager and torch.compile, the kernel, fusebot.h, dropin.py, test_dropin.py and reference.py.
Progress goes to stderr (a live line on a terminal, log lines elsewhere); the outcome goes to stdout.
--wall-seconds bounds the whole command, from its start to its exit: the module's capture and baselines, the search,
the confirmation of its finalists and writing DIR; its split is announced at the start. Ctrl-C stops the search (exit
status 130): the same command resumes it from DIR/trace.jsonl.

""" + exit_status_help()

optimize_app = app(HELP)


@optimize_app.command(cls=Command, help=HELP)
def optimize(
    problem: Annotated[str, typer.Argument(metavar="FILE[:CLASS]", show_default=False,
                                           help="The module to optimise and its example inputs.")],
    out: Annotated[Path, typer.Option("--out", "-o", metavar="DIR", help="The result folder (also holds the "
                                      "resumable trace).")],
    rounds: Annotated[int, typer.Option(min=1, metavar="N", help="Search rounds.")] = 3,
    ideas: Annotated[int, typer.Option(min=1, metavar="N", help="Ideas per round, split among the models by "
                                       "share.")] = 4,
    implementations: Annotated[int, typer.Option(min=1, metavar="N", help="Implementations per idea.")] = 2,
    beam: Annotated[int, typer.Option(min=1, metavar="N", help="Best verified kernels shown to the next "
                                      "round.")] = 3,
    max_repairs: Annotated[int, typer.Option(min=0, metavar="N", help="Repairs of a rejected candidate.")] = 4,
    wall_seconds: Annotated[float, typer.Option(metavar="S", help="Budget for the whole command, from its start to "
                                                "its exit, in seconds: capture and baselines, the search, the "
                                                "confirmation of its finalists and writing DIR all end within it.")] = 1800.0,
    gpu_seconds: Annotated[float | None, typer.Option(metavar="S", help="Budget: seconds spent in the "
                                                      "harness.")] = None,
    tokens: Annotated[int | None, typer.Option(metavar="N", help="Budget: LLM tokens (prompt + completion).")] = None,
    candidates: Annotated[int | None, typer.Option(metavar="N", help="Budget: candidates evaluated.")] = None,
    model: Annotated[list[str] | None, typer.Option("--model", "-m", metavar="NAME[:SHARE]", help="A model to ask "
                                                    "for ideas, repeatable; overrides FUSEBOT_LLM_MODELS.")] = None,
    backend: Annotated[str | None, typer.Option(metavar="cuda|cpu", help="Where kernels run (default: cuda "
                                                "where a GPU is present).")] = None,
    no_compile_baseline: Annotated[bool, typer.Option("--no-compile-baseline",
                                                      help="Skip the torch.compile baseline.")] = False,
    fresh: Annotated[bool, typer.Option("--fresh", help="Discard DIR's trace instead of resuming it.")] = False,
    no_builtin: Annotated[bool, typer.Option("--no-builtin", help="Only the configured models propose (no catalog, "
                                             "no source rewrites): to try a model by itself.")] = False,
    gpus: Annotated[str | None, typer.Option("--gpus", envvar="FUSEBOT_GPUS", metavar="all|0,1", help="The GPUs "
                                             "candidates are evaluated on at once (default: all visible).")] = None,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the search does.")] = False,
) -> None:
    console = stderr_console()
    setup_logging(verbose, console)
    refused = refuse_budget(wall_seconds, "--wall-seconds")
    if refused:
        raise fail(refused, ExitStatus.USAGE)
    deadline = Deadline(wall_seconds, start_s=process_start_s())  # from the command's start: torch's import counts
    from runner.harness.evaluator import HarnessConfig  # torch: when the command runs
    from runner.harness.gpus import device_evaluators, parse_gpus, visible_gpus  # torch: when the command runs
    from runner.pipeline import TRACE_FILE, make_proposers, optimize_problem  # torch: when the command runs

    budget = SearchBudget(rounds=rounds, ideas_per_round=ideas, implementations_per_idea=implementations, beam=beam,
                          max_repairs=max_repairs, wall_seconds=wall_seconds, gpu_seconds=gpu_seconds, tokens=tokens,
                          candidates=candidates)
    try:
        chosen: Backend = choose_backend(backend)  # type: ignore[assignment]
        spec = problem_for(problem)
        proposers = make_proposers(model or [], builtin=not no_builtin)
        devices = parse_gpus(gpus, visible_gpus()) if chosen == "cuda" else []
        with device_evaluators(spec, chosen, devices, HarnessConfig(compile_baseline=not no_compile_baseline)) as ev, \
                ProgressView(console, rounds) as view:
            o = optimize_problem(spec, out, budget, proposers, ev, chosen, fresh=fresh, progress=view,
                                 compile_baseline=not no_compile_baseline, deadline=deadline,
                                 reserve_s=exit_reserve_s(wall_seconds))
    except UsageError as e:
        raise fail(str(e), ExitStatus.USAGE) from None
    except ProblemError as e:
        raise fail(problem_message(e, parse_target(problem).path), ExitStatus.USAGE) from None
    except MachineError as e:
        raise fail(f"machine: {e}", ExitStatus.MACHINE) from None
    except KeyboardInterrupt:
        raise fail(f"interrupted: the same command resumes from {out / TRACE_FILE}", ExitStatus.INTERRUPTED) from None
    typer.echo(("improved: " if o.improved else "no improvement: ") + o.message)
    typer.echo(f"results in {out}/ (report.md, result.json{', dropin.py' if o.improved else ''})")
    exit_now(0)  # every file is written and every process closed: torch's teardown is not the budget's


if __name__ == "__main__":
    optimize_app(prog_name="fusebot optimize")
