"""Jobs: the `Jobs` part of the database (bot/store/store.py puts the parts together).

A job is what a trigger asked for (a PR's or a nightly run's targets at one commit); runners lease its units
(bot/store/units.py: one per target of a search, one for a benchmark or hygiene job), and the job follows them: it is
leased or running while a unit is, and finishes once, with the units' results gathered in target order, when the last
unit finishes. Every transition is one compare-and-swap UPDATE (`... WHERE state IN (...)`), so it is correct with
several bot processes, on SQLite and PostgreSQL alike. Job ids derive from a dedupe key (delivery id + index), so
handling one delivery twice (after a crash) never records a second job, nor second units: they are written in the
same transaction.

Job states: queued -> leased -> running -> succeeded | failed; any active state -> cancelled (and its units with it);
running -> queued again when no unit is leased any more (a released or expired lease: `retry_note` then says which
attempt comes next and why).
"""

from __future__ import annotations

import hashlib
import logging
import uuid
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from bot.store.base import StoreBase, writes
from bot.store.db import ACTIVE_STATES, JobRow, UnitRow, utcnow
from runner.contract import Job, JobResult, Progress

log = logging.getLogger(__name__)
_JOB_NS = uuid.UUID("6f1d3f0e-2b7a-4c51-9a0e-5b8f2f7c9d11")


class LeaseError(Exception):
    """The caller does not hold a live lease on this unit (wrong token, expired and re-leased, or finished)."""


def job_id_for(dedupe_key: str) -> str:
    return uuid.uuid5(_JOB_NS, dedupe_key).hex


def token_hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Lease:
    job: Job  # the unit: the job narrowed to one target, its id the unit's (the job's own when it has one unit)
    token: str
    expires_at: datetime


def split_job(job: Job) -> list[tuple[str, str, Job]]:
    """A job's units as (unit id, target name, the job narrowed to that target). A search of several targets has one
    unit per target, `<job id>.<index>`; a one-target search, a benchmark and a hygiene job have one unit, whose id is
    the job's own (a runner that leases it sees the job as it always did)."""
    if job.kind != "search" or len(job.targets) <= 1:
        return [(job.id, job.targets[0].name if job.targets else "", job)]
    return [(f"{job.id}.{i}", t.name, job.model_copy(update={"id": f"{job.id}.{i}", "targets": [t]}))
            for i, t in enumerate(job.targets)]


@dataclass(frozen=True)
class JobInfo:
    id: str
    repo: str
    sha: str
    pr_number: int | None
    trigger: str
    state: str
    attempts: int
    installation_id: int | None
    check_run_id: int | None
    notified_state: str | None
    source_path: str | None
    progress: Progress | None
    result: JobResult | None
    error: str | None
    spec: Job
    retry_note: str | None = None  # its latest retried unit's "attempt 2 of 3: the previous worker stopped answering"


def _info(row: JobRow) -> JobInfo:
    return JobInfo(
        id=row.id,
        repo=row.repo,
        sha=row.sha,
        pr_number=row.pr_number,
        trigger=row.trigger,
        state=row.state,
        attempts=row.attempts,
        installation_id=row.installation_id,
        check_run_id=row.check_run_id,
        notified_state=row.notified_state,
        source_path=row.source_path,
        progress=Progress.model_validate_json(row.progress) if row.progress else None,
        result=JobResult.model_validate_json(row.result) if row.result else None,
        error=row.error,
        spec=Job.model_validate_json(row.spec),
        retry_note=row.retry_note,
    )


class Jobs(StoreBase):
    """Jobs: recorded once per dedupe key (with their units), cancelled, and their check runs' outbox."""

    @writes
    def enqueue(
        self,
        job: Job,
        dedupe_key: str,
        *,
        installation_id: int | None,
        source_path: str | None = None,
    ) -> tuple[JobInfo, bool]:
        """Record a job once. `job.id` must be `job_id_for(dedupe_key)`. Returns (job, created)."""
        if job.id != job_id_for(dedupe_key):
            raise ValueError("job.id must be job_id_for(dedupe_key)")
        with self._s() as s:
            s.add(
                JobRow(
                    id=job.id,
                    dedupe_key=dedupe_key,
                    repo=job.repo,
                    installation_id=installation_id,
                    sha=job.sha,
                    pr_number=job.pr_number,
                    trigger=job.trigger,
                    state="queued",
                    spec=job.model_dump_json(),
                    source_path=source_path,
                )
            )
            now = utcnow()
            for i, (unit_id, target, spec) in enumerate(split_job(job)):
                s.add(UnitRow(id=unit_id, job_id=job.id, idx=i, repo=job.repo, target=target, state="queued",
                              spec=spec.model_dump_json(), created_at=now))
            try:  # the job and its units in one transaction: all of them once, or none
                s.commit()
                created = True
            except IntegrityError:
                s.rollback()
                created = False
            row = s.get(JobRow, job.id)
            assert row is not None
            return _info(row), created

    def get(self, job_id: str) -> JobInfo | None:
        with self._s() as s:
            row = s.get(JobRow, job_id)
            return _info(row) if row else None

    def list_jobs(self, repo: str | None = None, pr_number: int | None = None) -> list[JobInfo]:
        with self._s() as s:
            q = select(JobRow).order_by(JobRow.created_at)
            if repo is not None:
                q = q.where(JobRow.repo == repo)
            if pr_number is not None:
                q = q.where(JobRow.pr_number == pr_number)
            return [_info(r) for r in s.scalars(q)]

    def running(self, limit: int = 200) -> list[JobInfo]:
        """Jobs a runner holds now (leased or running), oldest first: the check runs that follow their progress."""
        with self._s() as s:
            q = select(JobRow).where(JobRow.state.in_(("leased", "running"))).order_by(JobRow.created_at).limit(limit)
            return [_info(r) for r in s.scalars(q)]

    def counts_by_state(self) -> dict[str, int]:
        with self._s() as s:
            rows = s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
            return {state: n for state, n in rows}

    @writes
    def cancel(self, repo: str, pr_number: int | None = None, job_id: str | None = None) -> list[str]:
        """Cancel active jobs of a repository (optionally one PR's, or one job). Returns their ids."""
        with self._s() as s:
            q = select(JobRow.id).where(JobRow.repo == repo, JobRow.state.in_(ACTIVE_STATES))
            if pr_number is not None:
                q = q.where(JobRow.pr_number == pr_number)
            if job_id is not None:
                q = q.where(JobRow.id == job_id)
            ids = list(s.scalars(q))
            if ids:
                s.execute(
                    update(JobRow)
                    .where(JobRow.id.in_(ids), JobRow.state.in_(ACTIVE_STATES))
                    .values(state="cancelled", finished_at=utcnow())
                )
                # the lease hashes stay: a holder's heartbeat learns of the cancellation, its late result is refused
                s.execute(
                    update(UnitRow)
                    .where(UnitRow.job_id.in_(ids), UnitRow.state.in_(ACTIVE_STATES))
                    .values(state="cancelled", finished_at=utcnow(), lease_expires_at=None)
                )
                s.commit()
        if ids:
            log.info("cancelled %d job(s) of %s (PR %s)", len(ids), repo, pr_number)
        return ids

    def active_source_paths(self) -> set[str]:
        with self._s() as s:
            q = select(JobRow.source_path).where(JobRow.state.in_(ACTIVE_STATES), JobRow.source_path.is_not(None))
            return {p for p in s.scalars(q) if p}

    def find_by_check_run(self, check_run_id: int) -> JobInfo | None:
        with self._s() as s:
            row = s.scalars(select(JobRow).where(JobRow.check_run_id == check_run_id)).first()
            return _info(row) if row else None

    def unnotified(self, limit: int = 50) -> list[JobInfo]:
        """Jobs whose check run does not show their current state yet (an outbox: survives restarts)."""
        with self._s() as s:
            q = (
                select(JobRow)
                .where((JobRow.notified_state.is_(None)) | (JobRow.notified_state != JobRow.state))
                .order_by(JobRow.updated_at)
                .limit(limit)
            )
            return [_info(r) for r in s.scalars(q)]

    @writes
    def mark_notified(self, job_id: str, state: str, check_run_id: int | None) -> None:
        with self._s() as s:
            values: dict[str, Any] = {"notified_state": state}
            if check_run_id is not None:
                values["check_run_id"] = check_run_id
            # updated_at must not move: it orders the outbox
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**values, updated_at=JobRow.updated_at))
            s.commit()
