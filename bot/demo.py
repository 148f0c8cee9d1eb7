"""`fusebot demo`: the whole flow on this machine, with no GitHub and no LLM.

It makes a local git repository from examples/ (modules marked `# fusebot: optimize`), finds the marked targets,
searches each one (on the GPU when there is one, the CPU backend otherwise) with the builtin proposers, runs the
generated drop-in's test, commits the kernels, drop-ins, tests and BENCHMARK.md on the local branch
`fusebot/main/examples` and prints the pull request it would have opened. Run it again: it reuses the recorded search
(the trace resumes) and updates the same branch and PR.
"""

from __future__ import annotations

import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Annotated

import git
import typer
from rich.console import Console

from bot.github.local_platform import LocalPlatform
from bot.publish.checks import CHECK_NAME, check_in_progress, check_queued
from bot.publish.plan import PullRequestPlan
from bot.publish.propose import propose
from bot.repo.discovery import MARKER, marked_targets
from runner.contract import Environment, ExitStatus, ProblemSpec, SearchBudget, TargetResult, TargetSpec
from runner.search.deadline import Deadline

log = logging.getLogger(__name__)

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
GROUP = "examples"
BASE = "main"

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False, help=__doc__,
                  context_settings={"help_option_names": ["-h", "--help"]})


class DemoError(Exception):
    """A demo setting or the machine is not usable; the message says what to do."""


# ---- the repository ------------------------------------------------------------------------------------------------

def prepare_repo(repo_dir: Path, examples: Path) -> git.Repo:
    """The demo repository with examples/ committed on main (a second run commits only what changed)."""
    if repo_dir.exists() and not (repo_dir / ".git").is_dir():
        raise DemoError(f"{repo_dir} exists and is not a git repository: choose another --workdir")
    repo = git.Repo(repo_dir) if repo_dir.exists() else git.Repo.init(repo_dir, initial_branch=BASE)
    if repo.head.is_valid() and (repo.head.is_detached or repo.active_branch.name != BASE):
        raise DemoError(f"{repo_dir} is not on {BASE}: check out {BASE} there first")
    with repo.config_writer() as cw:
        cw.set_value("user", "name", "fusebot demo")
        cw.set_value("user", "email", "demo@fusebot.invalid")
    dest = repo_dir / "examples"
    dest.mkdir(exist_ok=True)
    for src in sorted(examples.glob("*.py")):
        shutil.copyfile(src, dest / src.name)
    (repo_dir / ".gitignore").write_text("__pycache__/\n.fusebot-dropin-cache/\n")
    repo.git.add("--all")
    if not repo.head.is_valid() or repo.is_dirty(index=True, working_tree=False):
        repo.index.commit("examples: modules marked for fusebot")
    return repo


# ---- one target ------------------------------------------------------------------------------------------------

def _proposers():
    """The builtin strategy catalog, the source rewrites of the module (their own first-round quota, no share) and
    the seed proposer: everything fusebot proposes with no LLM."""
    # runner imports here, not at the top: they load torch, which `fusebot --help` and the bot never need
    from runner.proposers.catalog import catalog_proposers
    from runner.proposers.rewrite.proposer import rewrite_proposers  # torch: only when the demo searches
    from runner.proposers.seed import seed_proposers

    pool = [(p, 1.0) for p in catalog_proposers()] + [(p, 0.0) for p in rewrite_proposers()]
    return pool + list(seed_proposers()), "builtin strategy catalog + source rewrites + seed"


def search_target(t: TargetSpec, repo_dir: Path, runs: Path, budget: SearchBudget, backend: str,
                  compile_baseline: bool, proposers, platform: LocalPlatform, check_id: int) -> TargetResult:
    # runner imports here, not at the top: they load torch, which `fusebot --help` and the bot never need
    from runner.harness.evaluator import Evaluator
    from runner.pipeline import finish_timeout_s, optimize_problem, search_deadline
    from runner.results.files import Provenance, target_result
    from runner.results.outcome import proposal, trace_markdown

    spec = ProblemSpec(name=t.name, root=str(repo_dir), module=t.file.removesuffix(".py").replace("/", "."),
                       class_name=t.class_name, second_inputs=t.second_inputs)

    def progress(p):
        platform.update_check_run(check_id, check_in_progress(p, budget.rounds, t.name))

    deadline = Deadline(budget.wall_seconds)  # the target's whole budget: its drop-in's test and bench script too
    with Evaluator(spec, backend=backend, compile_baseline=compile_baseline) as ev:
        o = optimize_problem(spec, runs / t.name, budget, proposers, ev, backend, progress=progress,  # type: ignore[arg-type]
                             deadline=search_deadline(deadline))
    v = o.verdict
    commit = platform.head_sha(BASE)
    with tempfile.TemporaryDirectory(prefix="fusebot-check-") as scratch:  # the check runs on a copy of the repo
        shutil.copytree(repo_dir, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return target_result(spec, o.improved, o.message, o.best.candidate if o.best else None, v,
                             Provenance.for_verdict(t.name, v, repo=repo_dir.name, commit=commit),
                             trace_markdown(o), root=Path(scratch), file=t.file,
                             timeout_s=finish_timeout_s(deadline), **proposal(o))


# ---- the command -----------------------------------------------------------------------------------------------

@app.command()
def demo(
    workdir: Annotated[Path, typer.Option(metavar="DIR", help="Where the demo repository and search traces go.")] = \
        Path("fusebot-demo"),
    examples: Annotated[Path, typer.Option(metavar="DIR", help="Folder of marked example modules.")] = EXAMPLES,
    backend: Annotated[str | None, typer.Option(metavar="cuda|cpu", help="Where kernels run (default: cuda when a GPU "
                                                                          "is present).")] = None,
    rounds: Annotated[int, typer.Option(min=1, metavar="N", help="Search rounds per target.")] = 2,
    ideas: Annotated[int, typer.Option(min=1, metavar="N", help="Ideas per round.")] = 2,
    wall_seconds: Annotated[float, typer.Option(min=1, metavar="S", help="Budget per target, wall-clock seconds: "
                                                "baselines, search, confirmation, the drop-in's test and bench "
                                                "script.")] = 180.0,
    compile_baseline: Annotated[bool, typer.Option("--compile-baseline/--no-compile-baseline")] = True,
    threads: Annotated[int, typer.Option(min=1, metavar="N", help="CPU backend: threads for eager, torch.compile and the "
                                                     "kernels (OMP_NUM_THREADS).")] = 1,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Log what the search does.")] = False,
) -> None:
    """Run the flow on a local repository made from examples/ and print the PR it would open."""
    logging.basicConfig(level=logging.INFO if verbose else logging.WARNING,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    err = Console(stderr=True)
    if backend not in (None, "cuda", "cpu"):
        err.print(f"[red]--backend must be cuda or cpu, not {backend!r}[/red]")
        raise typer.Exit(ExitStatus.USAGE)
    if not examples.is_dir() or not list(examples.glob("*.py")):
        err.print(f"[red]{examples}: no example modules there[/red]")
        raise typer.Exit(ExitStatus.USAGE)
    from runner.harness.evaluator import default_backend  # loads torch (to ask for a GPU): only when run

    chosen = backend or default_backend()
    if chosen == "cpu":  # one thread for eager, torch.compile and kernels alike: timings a shared CPU can repeat
        os.environ["OMP_NUM_THREADS"] = str(threads)
    workdir = workdir.resolve()
    try:
        repo = prepare_repo(workdir / "repo", examples)
    except DemoError as e:
        err.print(f"[red]{e}[/red]")
        raise typer.Exit(ExitStatus.USAGE) from None
    repo_dir = Path(repo.working_tree_dir or workdir / "repo")
    targets = marked_targets(repo_dir)
    if not targets:
        err.print(f"[red]no marked targets ({MARKER!r} above a class) in {examples}[/red]")
        raise typer.Exit(ExitStatus.USAGE)
    proposers, proposer_name = _proposers()
    err.print(f"[bold]fusebot demo[/bold]: {len(targets)} marked target(s) in {repo_dir}; backend {chosen}; "
              f"proposers: {proposer_name}")
    platform = LocalPlatform(repo_dir)
    base_sha = platform.head_sha(BASE)
    check_id = platform.create_check_run(base_sha, CHECK_NAME, check_queued([t.name for t in targets]))
    budget = SearchBudget(rounds=rounds, ideas_per_round=ideas, implementations_per_idea=2, wall_seconds=wall_seconds)
    results: list[TargetResult] = []
    for t in targets:
        err.print(f"  searching [bold]{t.class_name}[/bold] ({t.file}) ...")
        r = search_target(t, repo_dir, workdir / "runs", budget, chosen, compile_baseline, proposers, platform,
                          check_id)
        results.append(r)
        err.print(f"    {'[green]faster[/green]' if r.improved else '[yellow]not proposed[/yellow]'}: {r.message}")
    env: Environment | None = next((r.verdict.environment for r in results if r.verdict and r.verdict.environment),
                                   None)
    plan = PullRequestPlan(repo=f"local/{repo_dir.name}", base=BASE, group=GROUP, commit=base_sha, results=results,
                           environment=env, trigger="demo")
    out = propose(platform, plan, base_sha=base_sha, check_run_id=check_id)
    if out.pull_request is None:
        err.print("[yellow]nothing proposed: no branch, no pull request[/yellow] (check run: neutral)")
        typer.echo(out.body)
        return
    what = "opened" if out.pull_request.created else "updated"
    err.print(f"[green]{what}[/green] local pull request #{out.pull_request.number} on branch "
              f"[bold]{plan.branch}[/bold] ({out.branch.sha[:12]}{'' if out.branch.changed else ', unchanged'}); "
              f"body: {out.pull_request.url}")
    err.print(f"  see it: git -C {repo_dir} show --stat {plan.branch}\n")
    typer.echo(out.body)


if __name__ == "__main__":
    app()
