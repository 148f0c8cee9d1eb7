"""From a trigger to a recorded job: checkout at the pinned SHA, config, discovery, tarball, enqueue.

Shared by every handler that starts work: `start_job` records a search, `start_kernel_job` a benchmark or hygiene job
(re-verify fusebot's kernels in a commit; none when it holds none). The user's mistakes are reported where the
maintainer looks, with annotations at the repository's own file and line, never as an exception: a config error
(including a target whose file or class does not exist) on the `fusebot config` check run, before any job is queued; a
marked file that does not parse on the `fusebot` check run. The config's check run is made once per commit (found
again on GitHub). A job is recorded under the key `<delivery id>:<index>`, so a re-handled delivery records nothing
new.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from bot.context import Context
from bot.github.platform import Annotation, CheckOutput
from bot.publish.text import clip
from bot.repo.config import CONFIG_PATH, ConfigError, FusebotConfig, load_config
from bot.repo.discovery import (
    SourceProblem,
    check_config_targets,
    checkout_cached,
    find_targets,
    kernel_folders,
    make_tarball,
    read_config_text,
    touched_kernel_folders,
)
from bot.store.jobs import JobInfo, job_id_for
from runner.contract import Job, JobKind

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Started:
    job: JobInfo | None  # None: nothing to run (no targets, or a config error)
    config: FusebotConfig | None
    created: bool = False


def _safe_dir(repo: str) -> str:
    return repo.replace("/", "__")


def checkout(ctx: Context, repo: str, installation_id: int, sha: str) -> Path:
    url = ctx.github.clone_url(installation_id, repo)
    return checkout_cached(url, sha, ctx.clones_dir / _safe_dir(repo))


def report_config_error(ctx: Context, repo: str, installation_id: int, sha: str, err: ConfigError) -> None:
    annotations = tuple(Annotation(path=p.path, line=p.line, message=p.message) for p in err.problems)
    summary = "\n".join(f"- `{p.path}` line {p.line}: {p.message}" for p in err.problems)
    _config_check(ctx, repo, installation_id, sha, CheckOutput(
        "completed", f"{CONFIG_PATH} is invalid", clip(f"fusebot could not use `{CONFIG_PATH}`:\n\n{summary}"),
        "failure", annotations=annotations))
    log.info("config error in %s@%s: %d problem(s)", repo, sha[:12], len(err.problems))


def load_checked_config(worktree: Path) -> FusebotConfig:
    """The commit's config, validated against the schema and its targets against the code; raises ConfigError."""
    text = read_config_text(worktree)
    config = load_config(text)
    check_config_targets(worktree, config, text)
    return config


def validate_config(ctx: Context, repo: str, installation_id: int, sha: str) -> bool:
    """Check the config at `sha` and report it as a check run (success or failure with annotations)."""
    worktree = checkout(ctx, repo, installation_id, sha)
    try:
        load_checked_config(worktree)
    except ConfigError as e:
        report_config_error(ctx, repo, installation_id, sha, e)
        return False
    _config_check(ctx, repo, installation_id, sha, CheckOutput(
        "completed", f"{CONFIG_PATH} is valid",
        f"`{CONFIG_PATH}` parsed and validated against the published schema and the code.", "success"))
    return True


def _config_check(ctx: Context, repo: str, installation_id: int, sha: str, output: CheckOutput) -> None:
    """The completed check run that reports on the repository's config: once per commit. The config at a commit
    never changes, so a second event about the same head (a PR opened, then labelled) finds the check run already
    there, on GitHub itself, and adds nothing."""
    host, name = ctx.platform(installation_id, repo), f"{ctx.settings.check_run_name} config"
    existing = host.find_check_run(sha, name)
    if existing is not None:
        log.info("%s@%s: the config was reported before (check run %s)", repo, sha[:12], existing)
        return
    host.create_check_run(sha, name, output)


def _checkout_with_config(ctx: Context, repo: str, installation_id: int, sha: str) -> tuple[Path, FusebotConfig | None]:
    """The commit checked out, and its config (None, reported on the commit, when it is invalid)."""
    worktree = checkout(ctx, repo, installation_id, sha)
    try:
        return worktree, load_checked_config(worktree)
    except ConfigError as e:
        report_config_error(ctx, repo, installation_id, sha, e)
        return worktree, None


def nothing_to_run(scope: str, problems: list[SourceProblem]) -> CheckOutput:
    """The check run of a trigger whose marked files cannot all be searched: each broken one annotated at its line;
    or, with none broken, why there is nothing to search."""
    if problems:
        lines = "\n".join(f"- `{p.path}` line {p.line}: {p.message}" for p in problems)
        return CheckOutput("completed", "Marked files need fixing", clip(
            f"fusebot could not read the marked module(s) {scope}:\n\n{lines}"), "failure",
            annotations=tuple(Annotation(p.path, p.line, p.message) for p in problems))
    return CheckOutput("completed", "Nothing to optimise",
                       f"No marked targets {scope}. Mark a module with `# fusebot: optimize` or list it in "
                       f"`{CONFIG_PATH}`; comment `/fusebot run all` on a pull request to run every target.", "neutral")


def _enqueue(ctx: Context, job: Job, key: str, worktree: Path, installation_id: int) -> tuple[JobInfo, bool]:
    """Record the job (idempotent on `key`) with its source tarball; count it when it is new."""
    tarball = make_tarball(worktree, ctx.sources_dir / _safe_dir(job.repo) / f"{job.sha}.tar.gz")
    info, created = ctx.store.enqueue(job, key, installation_id=installation_id, source_path=str(tarball))
    if created:
        ctx.metrics.jobs_created.labels(job.trigger).inc()
    return info, created


def start_job(
    ctx: Context,
    *,
    delivery_id: str,
    repo: str,
    installation_id: int,
    sha: str,
    trigger: str,
    ref: str | None = None,
    pr_number: int | None = None,
    changed_files: Iterable[str] | None = None,
    index: int = 0,
) -> Started:
    worktree, config = _checkout_with_config(ctx, repo, installation_id, sha)
    if config is None:
        return Started(job=None, config=None)
    found = find_targets(
        worktree, config.targets, markers=config.markers, ignore=config.ignore, changed_files=changed_files
    )
    targets = found.targets
    scope = "changed by this pull request" if changed_files is not None else "in the repository"
    if not targets or found.problems:
        log.info("%s@%s: %d marked target(s) %s, %d problem(s)", repo, sha[:12], len(targets), scope,
                 len(found.problems))
        name = ctx.settings.check_run_name + (" sources" if targets else "")  # beside the job's own check run
        ctx.platform(installation_id, repo).create_check_run(sha, name, nothing_to_run(scope, found.problems))
    if not targets:
        return Started(job=None, config=config)
    key = f"{delivery_id}:{index}"
    job = Job(id=job_id_for(key), repo=repo, sha=sha, ref=ref, trigger=trigger,  # type: ignore[arg-type]
              pr_number=pr_number, targets=targets, budget=config.budget, models=config.models)
    info, created = _enqueue(ctx, job, key, worktree, installation_id)
    if created:
        log.info("job %s queued: %s@%s (%s, %d target(s))", job.id, repo, sha[:12], trigger, len(targets))
    return Started(job=info, config=config, created=created)


def start_kernel_job(
    ctx: Context,
    *,
    kind: JobKind,
    delivery_id: str,
    repo: str,
    installation_id: int,
    sha: str,
    trigger: str,
    ref: str | None = None,
    pr_number: int | None = None,
    changed_files: Iterable[str] | None = None,
    index: int = 0,
) -> Started:
    """A benchmark or hygiene job: the kernel folders that hold a fusebot kernel at `sha` (only those that
    `changed_files` touch, when given: a PR's own kernels). Nothing is recorded when there are none, so a repository
    without fusebot kernels costs no runner time."""
    worktree, config = _checkout_with_config(ctx, repo, installation_id, sha)
    if config is None:
        return Started(job=None, config=None)
    touched = touched_kernel_folders(changed_files, config.kernels_dir) if changed_files is not None else None
    found = kernel_folders(worktree, config.kernels_dir, touched)
    if not found:
        log.info("%s@%s: no fusebot kernels under %s: no %s job", repo, sha[:12], config.kernels_dir, kind)
        return Started(job=None, config=config)
    key = f"{delivery_id}:{index}"
    job = Job(id=job_id_for(key), repo=repo, sha=sha, ref=ref, trigger=trigger,  # type: ignore[arg-type]
              pr_number=pr_number, targets=[], kind=kind, kernels_dir=config.kernels_dir, kernels=found)
    info, created = _enqueue(ctx, job, key, worktree, installation_id)
    if created:
        log.info("%s job %s queued: %s@%s, %d kernel(s)", kind, job.id, repo, sha[:12], len(found))
    return Started(job=info, config=config, created=created)


def rerun(ctx: Context, *, delivery_id: str, previous: JobInfo, installation_id: int) -> JobInfo:
    """A new job with the same targets at the same commit (check run re-requested)."""
    key = f"{delivery_id}:0"
    job = previous.spec.model_copy(update={"id": job_id_for(key)})
    source = previous.source_path
    if source is None or not Path(source).is_file():  # removed by retention: rebuild it from the pinned commit
        worktree = checkout(ctx, job.repo, installation_id, job.sha)
        source = str(make_tarball(worktree, ctx.sources_dir / _safe_dir(job.repo) / f"{job.sha}.tar.gz"))
    info, created = ctx.store.enqueue(job, key, installation_id=installation_id, source_path=source)
    if created:
        ctx.metrics.jobs_created.labels(job.trigger).inc()
    return info
