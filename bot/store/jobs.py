"""Jobs and their leases: the `Jobs` part of the database (bot/store/store.py puts the parts together).

Every transition is one compare-and-swap UPDATE (`... WHERE state IN (...)`), so it is correct with several bot
processes, on SQLite and PostgreSQL alike. Job ids derive from a dedupe key (delivery id + index), so handling one
delivery twice (after a crash) never records a second job.

Job states: queued -> leased -> running -> succeeded | failed; any active state -> cancelled;
leased/running with an expired lease -> queued again (or failed after `max_attempts`).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError

from bot.store.base import StoreBase, writes
from bot.store.db import ACTIVE_STATES, TERMINAL_STATES, JobRow, utcnow
from runner.contract import Job, JobResult, Progress

log = logging.getLogger(__name__)
_JOB_NS = uuid.UUID("6f1d3f0e-2b7a-4c51-9a0e-5b8f2f7c9d11")


class LeaseError(Exception):
    """The caller does not hold a live lease on this job (wrong token, expired and re-leased, or finished)."""


def job_id_for(dedupe_key: str) -> str:
    return uuid.uuid5(_JOB_NS, dedupe_key).hex


def _hash(token: str) -> str:
    return hashlib.sha256(token.encode()).hexdigest()


@dataclass(frozen=True)
class Lease:
    job: Job
    token: str
    expires_at: datetime


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
    )


class Jobs(StoreBase):
    """Jobs: recorded once per dedupe key, leased by runners, finished, cancelled, and their check runs' outbox."""

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
            try:
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

    def counts_by_state(self) -> dict[str, int]:
        with self._s() as s:
            rows = s.execute(select(JobRow.state, func.count()).group_by(JobRow.state)).all()
            return {state: n for state, n in rows}

    @writes
    def requeue_expired(self, now: datetime | None = None) -> int:
        """Leases whose holder went quiet: back to the queue, or failed once attempts are spent."""
        now = now or utcnow()
        expired = (JobRow.state.in_(("leased", "running"))) & (JobRow.lease_expires_at < now)
        with self._s() as s:
            failed = s.execute(
                update(JobRow)
                .where(expired, JobRow.attempts >= self.max_attempts)
                .values(state="failed", error="lease expired on every attempt", lease_hash=None, finished_at=now)
            ).rowcount
            requeued = s.execute(
                update(JobRow)
                .where(expired, JobRow.attempts < self.max_attempts)
                .values(state="queued", lease_hash=None, leased_by=None, lease_expires_at=None)
            ).rowcount
            s.commit()
        if failed or requeued:
            log.info("expired leases: %d requeued, %d failed", requeued, failed)
        return failed + requeued

    @writes
    def lease(self, runner: str, ttl_seconds: float, now: datetime | None = None) -> Lease | None:
        now = now or utcnow()
        self.requeue_expired(now)
        with self._s() as s:
            for _ in range(10):
                ids = s.scalars(
                    select(JobRow.id).where(JobRow.state == "queued").order_by(JobRow.created_at).limit(5)
                ).all()
                if not ids:
                    return None
                for job_id in ids:
                    token = secrets.token_urlsafe(32)
                    expires = now + timedelta(seconds=ttl_seconds)
                    res = s.execute(
                        update(JobRow)
                        .where(JobRow.id == job_id, JobRow.state == "queued")
                        .values(
                            state="leased",
                            lease_hash=_hash(token),
                            leased_by=runner,
                            lease_expires_at=expires,
                            attempts=JobRow.attempts + 1,
                            progress=None,
                        )
                    )
                    s.commit()
                    if res.rowcount == 1:
                        row = s.get(JobRow, job_id)
                        assert row is not None
                        s.refresh(row)
                        log.info("job %s leased by runner %s (attempt %d)", job_id, runner, row.attempts)
                        return Lease(job=Job.model_validate_json(row.spec), token=token, expires_at=expires)
        return None

    def check_lease(self, job_id: str, token: str, now: datetime | None = None) -> JobInfo:
        """The job, if `token` is its live lease; LeaseError otherwise."""
        now = now or utcnow()
        with self._s() as s:
            row = s.get(JobRow, job_id)
            if (
                row is None
                or row.lease_hash is None
                or not hmac.compare_digest(row.lease_hash, _hash(token))
                or row.state not in ("leased", "running")
                or row.lease_expires_at is None
                or row.lease_expires_at < now
            ):
                raise LeaseError(f"no live lease on job {job_id} for this token")
            return _info(row)

    @writes
    def heartbeat(
        self, job_id: str, token: str, progress: Progress, ttl_seconds: float, now: datetime | None = None
    ) -> str:
        """Extend the lease and store progress. Returns the job's state ('cancelled' tells the runner to stop)."""
        now = now or utcnow()
        with self._s() as s:
            res = s.execute(
                update(JobRow)
                .where(
                    JobRow.id == job_id,
                    JobRow.lease_hash == _hash(token),
                    JobRow.state.in_(("leased", "running")),
                    JobRow.lease_expires_at >= now,
                )
                .values(
                    state="running",
                    progress=progress.model_dump_json(),
                    lease_expires_at=now + timedelta(seconds=ttl_seconds),
                )
            )
            s.commit()
            if res.rowcount == 1:
                return "running"
            row = s.get(JobRow, job_id)
            if row is not None and row.state == "cancelled" and row.lease_hash == _hash(token):
                return "cancelled"
        raise LeaseError(f"no live lease on job {job_id} for this token")

    def complete(self, job_id: str, token: str, result: JobResult, now: datetime | None = None) -> bool:
        """Record the runner's result exactly once. True when recorded now, False when it was already recorded
        (a retried upload); LeaseError when the caller's lease is not the one holding the job."""
        if result.job_id != job_id:
            raise ValueError("result.job_id does not match the job")
        now = now or utcnow()
        state = "succeeded" if result.ok else "failed"
        return self._finish(job_id, token, now, state=state, result=result.model_dump_json(), error=result.error)

    def fail(self, job_id: str, token: str, error: str, now: datetime | None = None) -> bool:
        return self._finish(job_id, token, utcnow() if now is None else now, state="failed", error=error[:10_000])

    @writes
    def _finish(self, job_id: str, token: str, now: datetime, **values: Any) -> bool:
        with self._s() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.lease_hash == _hash(token), JobRow.state.in_(("leased", "running")))
                .values(finished_at=now, lease_expires_at=None, **values)
            )
            s.commit()
            if res.rowcount == 1:
                log.info("job %s finished: %s", job_id, values["state"])
                return True
            row = s.get(JobRow, job_id)
            if row is not None and row.lease_hash == _hash(token) and row.state in TERMINAL_STATES:
                return False  # the same lease already finished it (or it was cancelled under it)
        raise LeaseError(f"no live lease on job {job_id} for this token")

    @writes
    def release(self, job_id: str, token: str) -> bool:
        """The runner gives the job back (it is shutting down): straight back to the queue."""
        with self._s() as s:
            res = s.execute(
                update(JobRow)
                .where(JobRow.id == job_id, JobRow.lease_hash == _hash(token), JobRow.state.in_(("leased", "running")))
                .values(state="queued", lease_hash=None, leased_by=None, lease_expires_at=None)
            )
            s.commit()
            return res.rowcount == 1

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
