"""`fusebot optimize PROBLEM.py --out DIR`: search for a faster kernel and write the result folder.

DIR receives trace.jsonl (written as the search runs; running the same command again resumes from it), report.md,
result.json and, when a verified kernel beats the faster of eager and torch.compile, the kernel source, fusebot.h,
the drop-in module (dropin.py), its test (test_dropin.py) and, for a KernelBench-format problem, reference.py.
Exit status: 0 when the search ran (improved or not: result.json says which), 1 when the problem or the machine is
broken, 2 on a usage or configuration error.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Annotated

import typer
from pydantic import ValidationError
from rich.console import Console
from rich.live import Live
from rich.text import Text

from runner import dropin
from runner.contract import Backend, ProblemSpec, Progress, SearchBudget
from runner.proposer import GpuInfo, ProblemContext, Proposer
from runner.report import Outcome, outcome, report_markdown, result_json
from runner.search import EvaluatorLike, search
from runner.trace import read_events

log = logging.getLogger(__name__)

optimize_app = typer.Typer(add_completion=False, no_args_is_help=True, pretty_exceptions_enable=False,
                           help="Search for a faster fused kernel for one problem and write the result folder.")

TRACE_FILE = "trace.jsonl"
GENERATED = (dropin.DROPIN_FILE, dropin.TEST_FILE, dropin.REFERENCE_FILE, dropin.HEADER_FILE, "kernel.cpp",
             "kernel.cu", "candidate.py")


class UsageError(Exception):
    """A configuration or usage mistake: exit status 2, with a message that names the fix."""


# ---- proposers -------------------------------------------------------------------------------------------------

def make_proposers(models: Sequence[str]) -> list[tuple[Proposer, float]]:
    """LLM proposers when an endpoint is configured (FUSEBOT_LLM_* or --model), else the builtin catalog."""
    if models or os.environ.get("FUSEBOT_LLM_BASE_URL"):
        from runner.proposers.llm import LLMSettings, llm_proposers

        try:
            settings = LLMSettings(**({"models": ",".join(models)} if models else {}))
        except ValidationError as e:
            problems = "; ".join(f"FUSEBOT_LLM_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}"
                                 for err in e.errors())
            raise UsageError(f"LLM settings are invalid: {problems}") from None
        return list(llm_proposers(settings))
    try:
        from runner.proposers.catalog import catalog_proposers  # the builtin strategy catalog (its own issue)
    except ImportError:
        raise UsageError("no proposer: configure an LLM endpoint (FUSEBOT_LLM_BASE_URL, FUSEBOT_LLM_API_KEY and "
                         "FUSEBOT_LLM_MODELS or --model); the builtin strategy catalog is not installed") from None
    return list(catalog_proposers())


# ---- the run ---------------------------------------------------------------------------------------------------

def kernelbench_aliases(spec: ProblemSpec) -> str:
    """Lines that give a repository target KernelBench's names (Model, get_inputs, get_init_inputs), so that every
    proposer reads one convention whatever the module calls its class and factories."""
    lines = []
    kwargs = dict(spec.init_kwargs)
    if spec.class_name != "Model" or kwargs:
        lines.append(f"Model = {spec.class_name}" if not kwargs else
                     f"def Model(*args):\n    return {spec.class_name}(*args, **{kwargs!r})")
    if spec.input_shapes:
        dtype = spec.dtype or "float32"
        lines.append(f"def get_inputs():\n    import torch\n    return [torch.rand(s, dtype=torch.{dtype}) for s in "
                     f"{[list(x) for x in spec.input_shapes]!r}]")
    elif spec.inputs != "get_inputs" and ":" not in spec.inputs:
        lines.append(f"get_inputs = {spec.inputs}")
    if spec.init_args:
        lines.append(f"def get_init_inputs():\n    return {list(spec.init_args)!r}")
    elif spec.init_inputs and spec.init_inputs != "get_init_inputs" and ":" not in spec.init_inputs:
        lines.append(f"get_init_inputs = {spec.init_inputs}")
    elif not spec.init_inputs:
        lines.append("def get_init_inputs():\n    return []")
    return ("\n\n\n# fusebot: this target under KernelBench's names\n" + "\n\n\n".join(lines) + "\n") if lines else ""


def problem_context(spec: ProblemSpec, evaluator, backend: Backend) -> ProblemContext:
    """What the proposers may know, from the harness: reference, baselines, roofline, device."""
    source, baselines = evaluator.reference_source(), evaluator.baselines()  # (this order starts the judge first)
    source += kernelbench_aliases(spec)
    roofline = evaluator.roofline()
    env = evaluator.environment()
    specs = ""
    if backend == "cuda":
        import torch

        p = torch.cuda.get_device_properties(0)
        l2 = getattr(p, "L2_cache_size", 0)
        specs = f"{p.multi_processor_count} SMs, {l2 / 2**20:.0f} MB L2, {p.total_memory / 2**30:.0f} GiB, " \
                f"compute capability {p.major}.{p.minor}"
    gpu = GpuInfo(name=env.gpu or env.cpu or env.device, specs=specs,
                  copy_bandwidth_bytes_per_s=roofline.bandwidth_bytes_per_s if roofline else None,
                  notes=f"CUDA {env.cuda}, driver {env.driver}" if env.cuda else "")
    return ProblemContext(name=spec.name, reference_source=source, backend=backend, format="fast", gpu=gpu,
                          roofline=roofline, baselines=baselines)


def _check_trace(trace: Path, spec: ProblemSpec, backend: str, fresh: bool) -> None:
    if fresh:
        trace.unlink(missing_ok=True)
        return
    for ev in read_events(trace):
        if ev.get("event") in ("start", "resume"):
            if (ev.get("problem"), ev.get("backend")) != (spec.name, backend):
                raise UsageError(f"{trace} belongs to a search of {ev.get('problem')} on {ev.get('backend')}; "
                                 "use --fresh or another --out")
            log.info("resuming the search recorded in %s", trace)
            return


def write_outputs(out: Path, spec: ProblemSpec, o: Outcome, problem_file: Path | None) -> list[str]:
    """Write the result folder; a kernel (and its drop-in and test) only when it beat both baselines."""
    for name in GENERATED:  # a previous run's kernel must not outlive a run that found none
        (out / name).unlink(missing_ok=True)
    files: list[str] = []
    cand = o.best.candidate if o.improved and o.best else None
    if cand is not None:
        for name, text in cand.sources.items():
            (out / name).write_text(text)
            files.append(name)
        if cand.format == "fast":
            (out / dropin.HEADER_FILE).write_text((Path(__file__).parent / "csrc" / "fusebot.h").read_text())
            files.append(dropin.HEADER_FILE)
            if problem_file is not None:
                shutil.copyfile(problem_file, out / dropin.REFERENCE_FILE)
                files.append(dropin.REFERENCE_FILE)
            digest = hashlib.sha256("".join(cand.sources.values()).encode()).hexdigest()
            (out / dropin.DROPIN_FILE).write_text(dropin.dropin_source(spec, cand.backend, cand.extra_cflags, digest))
            (out / dropin.TEST_FILE).write_text(dropin.dropin_test_source(spec, cand.backend))
            files += [dropin.DROPIN_FILE, dropin.TEST_FILE]
    files += ["report.md", "result.json"]
    (out / "report.md").write_text(report_markdown(o))
    (out / "result.json").write_text(json.dumps(result_json(o, files), indent=1))
    return files


def optimize_problem(spec: ProblemSpec, out: Path, budget: SearchBudget, proposers: Sequence,
                     evaluator: EvaluatorLike, backend: Backend, *, fresh: bool = False,
                     progress: Callable[[Progress], None] | None = None, confirm_rounds: int = 5) -> Outcome:
    """Search (or resume the search recorded in out/trace.jsonl) and write the result folder."""
    out.mkdir(parents=True, exist_ok=True)
    trace = out / TRACE_FILE
    _check_trace(trace, spec, backend, fresh)
    ctx = problem_context(spec, evaluator, backend)
    result = search(ctx, evaluator, proposers, budget, trace, progress=progress)
    confirmed = None
    if result.best is not None and result.best.candidate is not None and hasattr(evaluator, "confirm"):
        # The fastest of many noisy measurements is partly the luckiest: re-time it against both baselines.
        if progress:
            progress(Progress(round=result.rounds, message="confirming the best kernel against the baselines"))
        confirmed = evaluator.confirm(result.best.candidate, rounds=confirm_rounds)
    o = outcome(spec.name, result, ctx.baselines, ctx.roofline, confirmed=confirmed)
    write_outputs(out, spec, o, Path(spec.path) if spec.path else None)
    return o


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
    from runner.errors import MachineError, ProblemError
    from runner.evaluate import Evaluator, default_backend

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
    from runner.cli import problem_from_file  # (imported here: runner.cli re-exports optimize_app)

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
