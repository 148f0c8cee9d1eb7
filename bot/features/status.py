"""`/fusebot status`: a pull request's jobs, each with its state, attempts and times (queued, started, finished). A job
whose worker stopped answering says which attempt it is on and why ("queued, attempt 2 of 3: the previous worker
stopped answering").

The times come from a read-only query of the jobs and units tables (`job_times`; bot/store/ has no such query):
queued is when the job was recorded, started when a runner last took its first unit (a target; a retried unit counts
from its latest lease), finished when the job reached its final state.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from sqlalchemy import func, select

from bot.store.db import ACTIVE_STATES, JobRow, UnitRow
from bot.store.jobs import JobInfo
from bot.store.store import Store

STATUS_MARKER = "<!-- fusebot:status -->"
NO_TIME = "–"


@dataclass(frozen=True)
class JobTimes:
    queued: datetime | None
    started: datetime | None
    finished: datetime | None


def job_times(store: Store, ids: list[str]) -> dict[str, JobTimes]:
    """When each job was queued, started and finished (aware UTC; None where not yet)."""
    if not ids:
        return {}
    with store.sessions() as s:
        rows = s.execute(select(JobRow.id, JobRow.created_at, JobRow.finished_at).where(JobRow.id.in_(ids))).all()
        started = dict(s.execute(select(UnitRow.job_id, func.min(UnitRow.leased_at))
                                 .where(UnitRow.job_id.in_(ids)).group_by(UnitRow.job_id)).all())
    return {job_id: JobTimes(queued, started.get(job_id), finished) for job_id, queued, finished in rows}


def when(t: datetime | None) -> str:
    return t.strftime("%Y-%m-%d %H:%M:%S UTC") if t is not None else NO_TIME


def _what(j: JobInfo) -> str:
    if j.spec.kind == "search":
        return f"{len(j.spec.targets)} target(s)"
    return f"{len(j.spec.kernels)} kernel(s)"


def _state(j: JobInfo) -> str:
    if j.state == "failed" and j.error:
        reason = " ".join(j.error.split())
        return f"failed: {reason[:80]}" + ("…" if len(reason) > 80 else "")
    state = j.state
    if j.state == "running" and j.progress is not None and j.progress.round:
        state = f"running (round {j.progress.round})"
    if j.retry_note and j.state in ACTIVE_STATES:  # its worker was lost (or gave it back): which attempt, and why
        state += f", {j.retry_note}"
    return state


def status_text(store: Store, repo: str, number: int) -> str:
    """The answer to `/fusebot status` on pull request `number`: one row per job, oldest first."""
    jobs = store.list_jobs(repo=repo, pr_number=number)
    if not jobs:
        return f"{STATUS_MARKER}\nNo fusebot jobs for this pull request yet."
    times = job_times(store, [j.id for j in jobs])
    rows = ["| job | kind | commit | trigger | state | attempts | queued | started | finished | what |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for j in jobs:
        t = times.get(j.id, JobTimes(None, None, None))
        state = _state(j).replace("|", "\\|")
        rows.append(f"| `{j.id[:12]}` | {j.spec.kind} | {j.sha[:12]} | {j.trigger} | {state} | {j.attempts} "
                    f"| {when(t.queued)} | {when(t.started)} | {when(t.finished)} | {_what(j)} |")
    return (STATUS_MARKER + "\n" + "\n".join(rows) + f"\n\nTimes are UTC; attempts count the runner leases, at most "
            f"{store.max_attempts}: a job whose worker stops answering goes to another until they are spent.")
