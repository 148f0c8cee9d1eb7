"""`fusebot action`: the GitHub Action's entry point. The App's whole flow in one process on the runner.

    pull_request / pull_request_target, `labeled` with the trigger label -> the marked targets the PR changes
    schedule                                                           -> every marked target on the default branch
    workflow_dispatch                                                  -> every marked target on the dispatched branch

Settings come from the environment GitHub sets (bot/action/settings.py), validated before anything runs. Discovery
reads the checked-out workspace; the search runs in this process (`runner.pipeline.run_job`, imported only when
a search runs, so the bot side never imports torch at module level); results are delivered by
bot/publish/deliver.py (bot/publish/propose.py underneath) on the GitHub platform, the same code the App uses: one
branch and PR per group, updated in place, and a fork's PR gets a comment with the patch, never a push.
The job summary and the step outputs are written last.

Label gating is the safety: a `pull_request_target` workflow, or any workflow on a self-hosted runner, must run
a PR's code only after a maintainer has labelled it (GitHub lets only people with triage or write access add
labels). Every other `pull_request` action is ignored here, whatever the workflow's `types:` say.
"""

from __future__ import annotations

import ctypes
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import git
import typer
from pydantic import ValidationError

from bot.action.report import RunReport, console_text, write_report
from bot.action.settings import ActionSettings, Skip, Trigger, trigger_of
from bot.github.client import token_client
from bot.github.github_platform import GitHubPlatform
from bot.github.patch import unified_patch
from bot.github.platform import Platform, PlatformError
from bot.logs import install_redaction, redact
from bot.publish.checks import CHECK_NAME, check_completed, check_in_progress, check_queued
from bot.publish.comments import fork_comments
from bot.publish.deliver import deliver
from bot.publish.plan import PullRequestPlan
from bot.publish.propose import branch_files
from bot.repo.config import ConfigError, FusebotConfig, load_config
from bot.repo.discovery import check_config_targets, find_targets
from runner.contract import ExitStatus, Job, JobResult, Progress, TargetSpec

log = logging.getLogger(__name__)

RunJob = Callable[[Job, Path, Callable[[Progress], None]], JobResult]
PlatformFactory = Callable[[ActionSettings], Platform]
# Variables that carry the GitHub token into this process; removed once read, so nothing started later inherits it.
TOKEN_VARIABLES = ("FUSEBOT_GITHUB_TOKEN", "GITHUB_TOKEN", "INPUT_GITHUB-TOKEN", "INPUT_GITHUB_TOKEN")
LLM_KEY_VARIABLE = "FUSEBOT_LLM_API_KEY"
PROGRESS_INTERVAL_SECONDS = 15.0
_PR_SET_DUMPABLE = 4

app = typer.Typer(add_completion=False, rich_markup_mode=None, pretty_exceptions_enable=False, help=__doc__,
                  context_settings={"help_option_names": ["-h", "--help"]})


def search(job: Job, source_dir: Path, progress: Callable[[Progress], None]) -> JobResult:
    """The real search (torch and the harness are imported here, not before). The proposers are made first, then
    the LLM key leaves the environment: the processes the search starts (compilers, candidates, the generated
    drop-in's test, all of which run the repository's code) never inherit it. With several GPUs the targets are
    searched at once, one search per GPU (runner.pipeline.run_job)."""
    from runner.pipeline import proposer_pools, run_job  # torch: imported only when a search runs

    pools = proposer_pools(job)  # one pool per search run at once (targets spread over the runner's GPUs)
    os.environ.pop(LLM_KEY_VARIABLE, None)
    return run_job(job, source_dir, progress, proposer_pools=pools)


def github_platform(settings: ActionSettings) -> Platform:
    """The GitHub platform on the workflow's token (GITHUB_API_URL: GitHub Enterprise Server works too)."""
    gh = token_client(settings.token.get_secret_value(), settings.api_url,
                      seconds_between_requests=settings.request_interval_seconds or None,
                      seconds_between_writes=settings.write_interval_seconds or None)
    return GitHubPlatform(gh, settings.repository)


def changed_files(workspace: Path, base_sha: str, head_sha: str) -> list[str] | None:
    """Files the PR changes (merge base to head), or None when the checkout lacks the history to tell."""
    try:
        out = git.Repo(workspace).git.diff("--name-only", f"{base_sha}...{head_sha}")
    except (git.GitCommandError, git.InvalidGitRepositoryError, git.NoSuchPathError) as e:
        log.warning("cannot tell which files the PR changes (%s); searching every marked target. Check out with "
                    "`fetch-depth: 0` to search only the changed ones", str(e).splitlines()[0][:200])
        return None
    return out.splitlines()


class _Progress:
    """Check-run updates from the search's progress, at most one per interval (GitHub's secondary rate limits)."""

    def __init__(self, platform: Platform, check_id: int | None, rounds: int,
                 interval: float = PROGRESS_INTERVAL_SECONDS):
        self.platform, self.check_id, self.rounds, self.interval = platform, check_id, rounds, interval
        self.last: float | None = None  # the monotonic time of the last update; None: none yet, the next one goes

    def __call__(self, p: Progress) -> None:
        now = time.monotonic()
        if self.check_id is None or (self.last is not None and now - self.last < self.interval):
            return
        self.last = now
        try:
            self.platform.update_check_run(self.check_id, check_in_progress(p, self.rounds))
        except Exception as e:  # progress is best effort: a failed update must not stop the search
            log.warning("check run progress not updated: %s", e)


def _config(settings: ActionSettings) -> FusebotConfig:
    """The workspace's config, validated against the schema and its targets against the code; raises ConfigError."""
    path = settings.workspace / settings.config_path
    text = path.read_text(errors="replace") if path.is_file() else None
    config = load_config(text, settings.config_path)
    check_config_targets(settings.workspace, config, text, settings.config_path)
    return config


def _job(settings: ActionSettings, cfg: FusebotConfig, trig: Trigger, targets: list[TargetSpec]) -> Job:
    budget = cfg.budget
    if settings.budget_seconds is not None:
        budget = budget.model_copy(update={"wall_seconds": settings.budget_seconds})
    return Job(id=f"action-{settings.run_id}-{settings.run_attempt}", repo=settings.repository, sha=trig.base_sha,
               ref=trig.base, trigger=trig.kind, pr_number=trig.pr_number, targets=targets, budget=budget,
               models=settings.model_list or cfg.models)


@dataclass(frozen=True)
class Plan:
    """What a run will search, once settings, config, event and workspace have been read."""

    cfg: FusebotConfig
    trig: Trigger
    job: Job
    where: str


def prepare(settings: ActionSettings) -> Plan | tuple[int, RunReport]:
    """Config, trigger, targets and job; or the exit status (runner.errors.ExitStatus: 2 for the repository's or the
    workflow's mistake) and report of a run that stops here."""
    try:
        cfg = _config(settings)
    except ConfigError as e:
        for p in e.problems:  # GitHub shows these as annotations at the offending line
            typer.echo(f"::error file={p.path},line={p.line}::{p.message}")
        return ExitStatus.USAGE, RunReport("configuration error", f"`{settings.config_path}` is invalid:",
                            problems=[f"line {p.line}: {p.message}" for p in e.problems])
    trig = trigger_of(settings, settings.load_event(), settings.label or cfg.trigger_label)
    if isinstance(trig, Skip):
        log.info("nothing to do: %s", trig.reason)
        return ExitStatus.OK, RunReport("nothing to do", trig.reason)
    changed = changed_files(settings.workspace, trig.pr_base_sha, trig.base_sha) if trig.pr_base_sha else None
    found = find_targets(settings.workspace, cfg.targets, markers=cfg.markers, ignore=cfg.ignore,
                         changed_files=changed)
    targets = found.targets
    where = f"PR #{trig.pr_number}" if trig.pr_number else f"`{trig.base}`"
    for p in found.problems:  # GitHub shows these as annotations at the offending line
        typer.echo(f"::error file={p.path},line={p.line}::{p.message}")
    if not targets and found.problems:
        return ExitStatus.USAGE, RunReport("marked files need fixing", f"No marked module {where} could be read as it is:",
                            problems=[f"`{p.path}` line {p.line}: {p.message}" for p in found.problems])
    if not targets:
        what = "changed by" if changed is not None else "in"
        return ExitStatus.OK, RunReport("nothing to do", f"No marked targets {what} {where} (`# fusebot: optimize` above a "
                                             f"class, or `targets:` in `{settings.config_path}`).")
    job = _job(settings, cfg, trig, targets)
    problems = llm_problems(job.models)
    if problems:
        for problem in problems:
            typer.echo(f"::error title=fusebot LLM settings::{problem}")
        return ExitStatus.USAGE, RunReport("LLM settings are invalid", "Set the inputs `llm-base-url`, `llm-api-key` "
                                           "and `models` together, or none of them (the builtin catalog).",
                                           problems=problems)
    return Plan(cfg, trig, job, where)


def run(settings: ActionSettings, run_job: RunJob | None = None,
        platform_factory: PlatformFactory | None = None) -> tuple[int, RunReport]:
    """One run of the Action: (exit status, what happened): 0 done, 2 the repository's mistake, 3 a failed search.
    Raises only for a broken machine."""
    plan = prepare(settings)
    if not isinstance(plan, Plan):
        return plan
    cfg, trig, job = plan.cfg, plan.trig, plan.job
    platform = (platform_factory or github_platform)(settings)
    check_id = _create_check(platform, trig, [t.name for t in job.targets])
    log.info("searching %d target(s) at %s (%s): %s", len(job.targets), trig.base_sha[:12], plan.where,
             ", ".join(t.name for t in job.targets))
    try:
        result = (run_job or search)(job, settings.workspace, _Progress(platform, check_id, job.budget.rounds))
        error = None if result.ok else (result.error or "the job failed")
    except Exception as e:  # a broken machine: the check run says so, then the step fails
        log.exception("the search failed")
        result, error = None, f"{type(e).__name__}: {e}"
    if result is None or error is not None:
        error = redact(error or "", [settings.token.get_secret_value()])
        if check_id is not None:
            empty = PullRequestPlan(settings.repository, trig.base, "kernels", trig.base_sha, [])
            platform.update_check_run(check_id, check_completed(empty, error=error))
        return ExitStatus.MACHINE, RunReport("the search failed", error)
    report = RunReport("done", f"Searched {len(job.targets)} target(s) at `{trig.base_sha[:12]}` ({plan.where}).",
                       results=result.targets, environment=result.environment)
    try:
        report.published = deliver(platform, job, result, base=trig.base, base_sha=trig.base_sha,
                                   check_run_id=check_id, label_pr=trig.pr_number, fork=trig.fork,
                                   kernels_dir=cfg.kernels_dir, grouping=cfg.pr_grouping)
    except PlatformError as e:
        if not trig.fork:
            raise
        # a fork's `pull_request` run gets a read-only token: the results and the patch go to the job summary
        log.warning("could not comment on the fork's PR: %s", e)
        report.problems.append(f"Could not comment on PR #{trig.pr_number} ({e}). On `pull_request`, GitHub gives a "
                               "fork's run a read-only token; use `pull_request_target` to have fusebot comment "
                               "(see the security notes in the README). The results and the patch are below.")
        report.attachment = fork_results(settings.workspace, settings.repository, trig, cfg, result)
    return ExitStatus.OK, report


def llm_problems(models: list[str]) -> list[str]:
    """The LLM endpoint's settings (FUSEBOT_LLM_*, which the search reads) checked before anything starts."""
    if not (models or os.environ.get("FUSEBOT_LLM_BASE_URL")):
        return []  # the builtin catalog: no endpoint, no key
    # the bot's modules import runner.contract alone (tests/bot/test_layout.py); the Action asks the runner here
    from runner.proposers.llm.proposer import LLMSettings

    try:
        LLMSettings(**({"models": ",".join(models)} if models else {}))  # type: ignore[arg-type]
    except ValidationError as e:
        return [f"FUSEBOT_LLM_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}" for err in e.errors()]
    return []


def _create_check(platform: Platform, trig: Trigger, names: list[str]) -> int | None:
    try:
        return platform.create_check_run(trig.base_sha, CHECK_NAME, check_queued(names))
    except PlatformError as e:
        if not trig.fork:
            raise
        log.warning("no check run (a fork's pull_request run has a read-only token): %s", e)
        return None


SUMMARY_LIMIT = 1 << 20  # GitHub's limit on a step's job summary


def fork_results(workspace: Path, repo: str, trig: Trigger, cfg: FusebotConfig, result: JobResult) -> str:
    """The comments fusebot would have posted on the fork's PR, with the patch against the checked-out head."""
    plan = PullRequestPlan(repo, trig.base, "kernels", trig.base_sha, result.targets,
                           environment=result.environment, kernels_dir=cfg.kernels_dir, source_pr=trig.pr_number,
                           trigger=trig.kind)
    files = branch_files(plan, lambda p: (workspace / p).read_text() if (workspace / p).is_file() else None)
    old = {p: (workspace / p).read_text() if (workspace / p).is_file() else None for p in files}
    # a summary holds a megabyte: one part, unless the patch is larger
    return "\n\n".join(fork_comments(plan, unified_patch(old, files), limit=SUMMARY_LIMIT))


def load_settings() -> ActionSettings:
    """The settings, then the token removed from the environment (candidates and compilers never see it)."""
    settings = ActionSettings()  # type: ignore[call-arg]  (from the environment)
    for name in TOKEN_VARIABLES:
        os.environ.pop(name, None)
    install_redaction([settings.token.get_secret_value(), os.environ.get(LLM_KEY_VARIABLE, "")])
    return settings


def non_dumpable() -> bool:
    """Linux: other processes of this user can no longer read this one's memory or its initial environment
    (/proc/PID/environ still holds the token after os.environ forgets it). Children are not affected."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) == 0
    except (OSError, AttributeError):  # not Linux
        return False


@app.command()
def action(
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Debug logging.")] = False,
) -> None:
    """Run fusebot for the event that started this workflow (GITHUB_EVENT_NAME, GITHUB_EVENT_PATH)."""
    try:
        settings = load_settings()
    except ValidationError as e:
        for err in e.errors():
            where = ".".join(str(p) for p in err["loc"]) or "settings"
            typer.echo(f"::error title=fusebot settings::{where}: {err['msg']}", err=True)
        raise typer.Exit(ExitStatus.USAGE) from None
    logging.basicConfig(level=logging.DEBUG if verbose else settings.log_level.upper(),
                        format="%(levelname)s %(name)s: %(message)s")
    if not non_dumpable():
        log.warning("could not make this process non-dumpable: same-user processes may read its environment")
    try:
        code, report = run(settings)
    except PlatformError as e:  # GitHub refused or could not be reached
        typer.echo(f"::error title=fusebot::{redact(str(e), [settings.token.get_secret_value()])}", err=True)
        raise typer.Exit(ExitStatus.MACHINE) from None
    write_report(report, settings.step_summary, settings.output)
    typer.echo(console_text(report))
    for number, url in report.pulls():
        typer.echo(f"pull request #{number}: {url}")
    raise typer.Exit(code)


if __name__ == "__main__":
    app()
