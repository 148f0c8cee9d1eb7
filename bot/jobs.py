"""The durable state machine: the webhook inbox, jobs and their leases, installed repositories.

Every transition is one compare-and-swap UPDATE (`... WHERE state IN (...)`), so it is correct with several bot
processes, on SQLite and PostgreSQL alike. Job ids derive from a dedupe key (delivery id + index), so handling one
delivery twice (after a crash) never records a second job.

Job states: queued -> leased -> running -> succeeded | failed; any active state -> cancelled;
leased/running with an expired lease -> queued again (or failed after `max_attempts`).
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import secrets
import threading
import uuid
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any, TypeVar

from sqlalchemy import func, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from bot.db import ACTIVE_STATES, TERMINAL_STATES, Delivery, JobRow, RepoRow, utcnow
from bot.webhooks import Event
from runner.contract import Job, JobResult, Progress

log = logging.getLogger(__name__)
T = TypeVar("T")
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


def _writes(method: Callable[..., T]) -> Callable[..., T]:
    """Serialise this process's write transactions on SQLite: one writer at a time queues fairly on a lock instead
    of many threads spinning in SQLite's busy handler (whose back-off sleeps made multi-second tails under load).
    PostgreSQL needs no lock: its row locks and the compare-and-swap UPDATEs do the work."""

    @functools.wraps(method)
    def wrapper(self: Store, *args: Any, **kwargs: Any) -> T:
        with self._write_lock:
            return method(self, *args, **kwargs)

    return wrapper


class Store:
    def __init__(self, sessions: sessionmaker, *, max_attempts: int = 3, claim_seconds: float = 60.0) -> None:
        self.sessions = sessions
        self.max_attempts = max_attempts
        self.claim = timedelta(seconds=claim_seconds)
        is_sqlite = sessions.kw["bind"].dialect.name == "sqlite"
        self._write_lock: AbstractContextManager[Any] = threading.RLock() if is_sqlite else nullcontext()

    def _s(self) -> Session:
        return self.sessions()

    # ---- inbox ---------------------------------------------------------------------------------------------

    @_writes
    def record_delivery(self, ev: Event, raw_body: bytes | None = None) -> bool:
        """Store a delivery for the background worker. False when this delivery id was seen before.
        `raw_body`, when given, is stored as received (it is `ev.data` as JSON: no second serialisation)."""
        payload = raw_body.decode() if raw_body is not None else json.dumps(ev.data)
        with self._s() as s:
            s.add(Delivery(id=ev.delivery_id, event=ev.name, action=ev.action, payload=payload))
            try:
                s.commit()
            except IntegrityError:
                s.rollback()
                return False
        return True

    @_writes
    def claim_delivery(self, now: datetime | None = None) -> Event | None:
        """Take the oldest pending delivery (or one whose claim lapsed: its processor died)."""
        now = now or utcnow()
        with self._s() as s:
            for _ in range(5):
                row = s.execute(
                    select(Delivery.id)
                    .where(Delivery.status.in_(("pending", "processing")))
                    .where((Delivery.claimed_until.is_(None)) | (Delivery.claimed_until < now))
                    .order_by(Delivery.received_at)
                    .limit(1)
                ).first()
                if row is None:
                    return None
                res = s.execute(
                    update(Delivery)
                    .where(Delivery.id == row.id, Delivery.status.in_(("pending", "processing")))
                    .where((Delivery.claimed_until.is_(None)) | (Delivery.claimed_until < now))
                    .values(status="processing", claimed_until=now + self.claim, attempts=Delivery.attempts + 1)
                )
                s.commit()
                if res.rowcount == 1:
                    d = s.get(Delivery, row.id)
                    assert d is not None
                    return Event(name=d.event, delivery_id=d.id, data=json.loads(d.payload))
        return None

    @_writes
    def finish_delivery(self, delivery_id: str, error: str | None = None, now: datetime | None = None) -> None:
        now = now or utcnow()
        with self._s() as s:
            d = s.get(Delivery, delivery_id)
            if d is None:
                return
            if error is None:
                d.status, d.done_at, d.error, d.claimed_until = "done", now, None, None
            elif d.attempts >= self.max_attempts:
                d.status, d.done_at, d.error = "failed", now, error
            else:  # retry later, backing off
                d.status, d.error = "pending", error
                d.claimed_until = now + timedelta(seconds=min(300, 5 * 2**d.attempts))
            s.commit()

    def delivery_status(self, delivery_id: str) -> str | None:
        with self._s() as s:
            d = s.get(Delivery, delivery_id)
            return d.status if d else None

    def delivery_counts(self) -> dict[str, int]:
        with self._s() as s:
            rows = s.execute(select(Delivery.status, func.count()).group_by(Delivery.status)).all()
            return {status: n for status, n in rows}

    # ---- jobs ----------------------------------------------------------------------------------------------

    @_writes
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

    @_writes
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

    @_writes
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

    @_writes
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

    @_writes
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

    @_writes
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

    @_writes
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

    @_writes
    def prune_payloads(self, before: datetime) -> int:
        """Drop stored payloads of deliveries handled before `before`; the ids stay as the replay guard."""
        with self._s() as s:
            n = s.execute(
                update(Delivery)
                .where(Delivery.status.in_(("done", "failed")), Delivery.done_at < before, Delivery.payload != "")
                .values(payload="")
            ).rowcount
            s.commit()
            return n

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

    @_writes
    def mark_notified(self, job_id: str, state: str, check_run_id: int | None) -> None:
        with self._s() as s:
            values: dict[str, Any] = {"notified_state": state}
            if check_run_id is not None:
                values["check_run_id"] = check_run_id
            # updated_at must not move: it orders the outbox
            s.execute(update(JobRow).where(JobRow.id == job_id).values(**values, updated_at=JobRow.updated_at))
            s.commit()

    # ---- repositories --------------------------------------------------------------------------------------

    @_writes
    def upsert_repo(self, full_name: str, installation_id: int) -> None:
        with self._s() as s:
            row = s.get(RepoRow, full_name)
            if row is None:
                s.add(RepoRow(full_name=full_name, installation_id=installation_id))
            else:
                row.installation_id = installation_id
            try:
                s.commit()
            except IntegrityError:  # added concurrently: fine
                s.rollback()

    @_writes
    def remove_repo(self, full_name: str) -> None:
        with self._s() as s:
            row = s.get(RepoRow, full_name)
            if row is not None:
                s.delete(row)
                s.commit()

    def repos(self) -> list[RepoRow]:
        with self._s() as s:
            return list(s.scalars(select(RepoRow).order_by(RepoRow.full_name)))

    @_writes
    def set_schedule(
        self, full_name: str, *, enabled: bool, cron: str, timezone: str, next_run_at: datetime | None
    ) -> None:
        with self._s() as s:
            row = s.get(RepoRow, full_name)
            if row is None:
                return
            row.schedule_enabled, row.cron, row.timezone, row.next_run_at = enabled, cron, timezone, next_run_at
            s.commit()

    @_writes
    def advance_schedule(self, full_name: str, expected: datetime | None, next_run_at: datetime) -> bool:
        """Move a repository's next run from `expected` to `next_run_at`; False when another process did it."""
        with self._s() as s:
            cond = RepoRow.next_run_at.is_(None) if expected is None else RepoRow.next_run_at == expected
            res = s.execute(
                update(RepoRow).where(RepoRow.full_name == full_name, cond).values(next_run_at=next_run_at)
            )
            s.commit()
            return res.rowcount == 1
