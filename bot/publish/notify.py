"""Job state -> check run on the job's commit. An outbox: the background loop calls `sync_check_runs` until every
job's check run shows its state, so a restart or an unreachable GitHub delays updates but never loses one.

`check_run_view` is pure: a job's state as a check run's output, with the Stop or Run again button. A succeeded
search's check run then gets the full tables from its delivery (bot/publish/deliver.py), which also writes the
labelled PR's status comment. Once that comment exists it follows the PR's newest search job (`status_view`): a
newer run queued, running, cancelled or failed replaces the last run's "done", so it never shows results as current
after a later run was stopped; an older job that finishes late does not overwrite a newer one's state.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from bot.github.platform import CheckOutput, Platform
from bot.publish.comments import status_comment
from bot.publish.deliver import deliver_job
from bot.publish.kinds import KERNEL_JOBS
from bot.publish.text import clip
from bot.store.db import ACTIVE_STATES
from bot.store.jobs import JobInfo
from bot.store.units import UnitInfo

if TYPE_CHECKING:  # the App's context is built above this layer; only its type is needed here
    from bot.context import Context

log = logging.getLogger(__name__)


def check_run_name(base: str, kind: str) -> str:
    """`fusebot` for a search; `fusebot benchmark` and `fusebot hygiene` for the others, so they never hide it."""
    return base if kind == "search" else f"{base} {kind}"


def check_run_view(job: JobInfo, units: Sequence[UnitInfo] = ()) -> CheckOutput:
    """A job's state as its check run shows it, with the button that fits (Stop while it runs, Run again after).
    While a search runs, each target's line says where its unit is (`units`: the job's units, in target order)."""
    out = _view(job, units)
    return CheckOutput(out.status, out.title, clip(out.summary), out.conclusion, out.text,
                       actions=tuple(check_run_actions(out.status)))


def _unit_line(u: UnitInfo) -> str:
    """One target's state while its job runs: `- `T`: running on gpu-b, round 2, 3 verified`."""
    if u.state in ("leased", "running"):
        where = f" on {u.leased_by}" if u.leased_by else ""
        p = u.progress
        detail = f", round {p.round}, {p.built} built, {p.verified} verified" if p else ""
        state = f"running{where}{detail}"
    else:
        state = {"queued": "waiting for a GPU runner", "succeeded": "done"}.get(u.state, u.state)
    if u.retry_note and u.state in ACTIVE_STATES:
        again = f" — {u.retry_note}"
    else:
        again = f" (attempt {u.attempts})" if u.attempts > 1 else ""
    return f"- `{u.target}`: {state}{again}"


def retry_line(job: JobInfo) -> str:
    """`Attempt 2 of 3: the previous worker stopped answering (runner gpu-a).` and a blank line, while a job whose
    worker was lost (or gave it back) waits for or runs its next attempt; empty otherwise."""
    note = job.retry_note if job.state in ACTIVE_STATES else None
    return f"{note[:1].upper()}{note[1:]}.\n\n" if note else ""


def _view(job: JobInfo, units: Sequence[UnitInfo] = ()) -> CheckOutput:
    if job.state == "cancelled":
        return CheckOutput("completed", "Cancelled", "The job was cancelled.", "cancelled")
    if job.state == "failed":
        return CheckOutput("completed", "fusebot failed", f"The job failed: {job.error or 'no detail'}", "failure")
    if job.spec.kind in KERNEL_JOBS:
        return _kernel_job_view(job)
    n = len(job.spec.targets)
    targets = "\n".join(f"- `{t.name}` ({t.file})" for t in job.spec.targets[:50])
    again = retry_line(job)
    if job.state == "queued":
        title = f"Queued again: {n} target(s)" if again else f"Queued: {n} target(s)"
        return CheckOutput("queued", title, f"{again}Waiting for a GPU runner.\n\n{targets}")
    if job.state in ("leased", "running"):
        p = job.progress
        detail = f"round {p.round}, {p.built} built, {p.verified} verified" if p else "starting"
        if p is not None and p.best_speedup is not None:
            detail += f", best {p.best_speedup:.2f}x unconfirmed"
        if len(units) > 1:
            targets = "\n".join(_unit_line(u) for u in units[:50])
        return CheckOutput("in_progress", f"Searching: {detail}", again + targets)
    targets = job.result.targets if job.result else []
    improved = [t for t in targets if t.improved]
    if not improved:
        why = "\n".join(f"- `{t.target}`: {t.message}" for t in targets[:50]) or "No target was searched."
        return CheckOutput("completed", "Nothing proposed", why, "neutral")
    lines = "\n".join(f"- `{t.target}`: {t.message}" for t in improved)
    return CheckOutput("completed", f"Faster kernels for {len(improved)} of {n} target(s)", lines, "success")


def _kernel_job_view(job: JobInfo) -> CheckOutput:
    """A job that searches nothing (bot/publish/kinds.py): fusebot's kernels in the commit, re-verified and re-timed."""
    spec = job.spec
    kernels = "\n".join(f"- `{spec.kernels_dir}/{k}`" for k in spec.kernels[:50])
    kind = KERNEL_JOBS[spec.kind]
    what = kind.verb  # "Re-measure", "Re-verify"
    again = retry_line(job)
    if job.state == "queued":
        return CheckOutput("queued", f"Queued{' again' if again else ''}: {what.lower()} {len(spec.kernels)} kernel(s)",
                           f"{again}Waiting for a GPU runner.\n\n{kernels}")
    if job.state in ("leased", "running"):
        p = job.progress
        title = p.message[:1].upper() + p.message[1:] if p and p.message else f"{what}: starting"
        return CheckOutput("in_progress", clip(title[:255]), again + kernels)
    if job.result is None:
        return CheckOutput("completed", "No result", "The job finished without a result.", "neutral")
    out = kind.check(spec, job.result)
    return CheckOutput(out.status, out.title, out.summary, out.conclusion)


def status_view(job: JobInfo) -> str:
    """The labelled PR's status comment while its newest search job is not done (pure)."""
    sha = f"`{job.sha[:12]}`"
    if job.state == "queued" and job.retry_note:
        state, detail = "queued", f"The run at {sha} is waiting for a GPU runner again: {job.retry_note}."
    elif job.state == "queued":
        state, detail = "queued", f"A new run at {sha} is waiting for a GPU runner."
    elif job.state in ("leased", "running"):
        state, detail = "running", f"Searching {sha} ({job.retry_note or f'attempt {max(job.attempts, 1)}'})."
    elif job.state == "cancelled":
        state, detail = "cancelled", f"The run at {sha} was cancelled: nothing from it will be proposed."
    else:
        state, detail = "failed", f"The run at {sha} failed: {job.error or 'no detail'}"
    detail += (f"\n\nJob `{job.id[:12]}`; `/fusebot status` lists every run. Earlier runs' results stay on their "
               "check runs and pull requests.")
    return status_comment(job.pr_number or 0, state, detail=detail)


def follow_status(ctx: Context, host: Platform, job: JobInfo) -> None:
    """Keep the labelled PR's status comment on its newest search job (see the module's docstring)."""
    if job.pr_number is None or job.spec.kind != "search":
        return
    searches = [j for j in ctx.store.list_jobs(repo=job.repo, pr_number=job.pr_number) if j.spec.kind == "search"]
    newest = searches[-1] if searches else job
    if newest.state == "succeeded" or (newest.id != job.id and job.state != "succeeded"):
        return  # the newest run's own delivery wrote it; an older run's state change is not news
    if not any(j.state == "succeeded" for j in searches):
        return  # no status comment yet: the check run shows the state, the comment comes with the first results
    host.upsert_comment(job.pr_number, "status", f"pr-{job.pr_number}", status_view(newest))


STOP = {"label": "Stop", "description": "Cancel this fusebot job", "identifier": "stop"}
RERUN = {"label": "Run again", "description": "Run this fusebot job again", "identifier": "rerun"}


def check_run_actions(status: str) -> list[dict[str, str]]:
    """The buttons on the check run (they arrive as check_run.requested_action)."""
    return [STOP] if status != "completed" else [RERUN]


def sync_check_runs(ctx: Context, limit: int = 20, progress: ProgressOutbox | None = None) -> int:
    """Bring check runs up to date with job states. Returns how many were written. `progress`: the outbox that
    follows running jobs' progress, told what each write showed."""
    done = 0
    for job in ctx.store.unnotified(limit):
        if job.installation_id is None:
            ctx.store.mark_notified(job.id, job.state, None)
            continue
        host = ctx.platform(job.installation_id, job.repo)
        running = job.spec.kind == "search" and job.state in ("leased", "running")
        out = check_run_view(job, ctx.store.units(job.id) if running else ())
        if job.check_run_id is None:
            run_id = host.create_check_run(job.sha, check_run_name(ctx.settings.check_run_name, job.spec.kind), out,
                                           external_id=job.id)
        else:
            run_id = job.check_run_id
            host.update_check_run(run_id, out)
        if job.state == "succeeded" and job.result is not None:  # PRs, full tables, the status comment
            deliver_job(host, job, run_id)
        follow_status(ctx, host, job)
        ctx.store.mark_notified(job.id, job.state, run_id)
        if progress is not None and running:
            progress.note(job)
        done += 1
    return done


PROGRESS_INTERVAL_S = 10.0  # the least time between two progress updates of one check run (GitHub's rate limits)


class ProgressOutbox:
    """Running searches' check runs follow their progress (round, built, verified, best): rewritten when it changed,
    at most once every `interval_s` per job. The state outbox (`sync_check_runs`) writes a job's check run when its
    state changes; this one between those, while a runner works on it."""

    def __init__(self, interval_s: float = PROGRESS_INTERVAL_S, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval_s, self.clock = interval_s, clock
        self.shown: dict[str, tuple[str, float]] = {}  # job id -> (the progress its check run shows, when written)

    def note(self, job: JobInfo) -> None:
        """The job's check run was just written with its current progress."""
        self.shown[job.id] = (job.progress.model_dump_json() if job.progress else "", self.clock())

    def sync(self, ctx: Context) -> int:
        """Update the check runs whose progress moved. Returns how many were written."""
        now, done = self.clock(), 0
        running = [j for j in ctx.store.running() if j.spec.kind == "search"]
        self.shown = {k: v for k, v in self.shown.items() if k in {j.id for j in running}}
        for job in running:
            if job.check_run_id is None or job.installation_id is None or job.notified_state != job.state:
                continue  # the state outbox writes it first
            seen = job.progress.model_dump_json() if job.progress else ""
            last = self.shown.get(job.id)
            if last is None and not seen:
                continue
            if last is not None and (last[0] == seen or now - last[1] < self.interval_s):
                continue
            host = ctx.platform(job.installation_id, job.repo)
            host.update_check_run(job.check_run_id, check_run_view(job, ctx.store.units(job.id)))
            self.shown[job.id] = (seen, now)
            done += 1
        return done
