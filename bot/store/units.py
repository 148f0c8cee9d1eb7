"""Units and their leases: the `Units` part of the database (bot/store/store.py puts the parts together).

A unit is one target of a job (bot/store/jobs.py `split_job`): N workers on N GPUs, on one host or many, work one PR
or one nightly run at once. Leases, retries and idempotence are per unit, with the patterns jobs had:

- every transition is one compare-and-swap UPDATE on the unit (`... WHERE lease_hash = ? AND state IN (...)`);
- a lease expires after its TTL without a heartbeat (its worker stopped answering): the unit goes back to the queue
  with a note for its next attempt ("attempt 2 of 3: the previous worker stopped answering"), or fails once
  `max_attempts` leases are spent, with that reason;
- a result from a lease that has been replaced is refused (LeaseError), a repeated upload records nothing.

Each transition then brings the unit's job up to date in the same transaction (`_sync_job`): leased or running while a
unit is, back to queued when none is, and, when the last unit finishes, the units' results gathered into the job's one
result, in target order, by one compare-and-swap on the job: exactly once, whichever worker finished last. On
PostgreSQL the transaction first locks the job's row, so two units finishing at once cannot both miss the other.

Leasing is fair: repositories take turns (the one served longest ago first), and a repository holds at most
`max_per_repo` leased units at once (checked inside the leasing UPDATE; on PostgreSQL under a per-repository advisory
lock, so two bot processes cannot both take the last place).

Unit states: queued -> leased -> running -> succeeded | failed | cancelled (with its job).
"""

from __future__ import annotations

import hashlib
import hmac
import logging
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import exists, func, select, text, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, aliased

from bot.store.attempts import attempt_of, given_back_note, lost_on_last_attempt, lost_worker_note
from bot.store.base import StoreBase, writes
from bot.store.db import ACTIVE_STATES, TERMINAL_STATES, JobRow, UnitRow
from bot.store.jobs import Lease, LeaseError, split_job, token_hash
from runner.contract import Job, JobResult, Progress, TargetResult

log = logging.getLogger(__name__)
HELD = ("leased", "running")
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)


@dataclass(frozen=True)
class UnitInfo:
    id: str
    job_id: str
    index: int
    repo: str
    target: str
    state: str
    attempts: int
    leased_by: str | None
    progress: Progress | None
    result: JobResult | None
    error: str | None
    source_path: str | None = None  # the job's source tarball (check_lease fills it in)
    retry_note: str | None = None  # why this is not its first attempt: "attempt 2 of 3: the previous worker ..."


def _unit_info(row: UnitRow, source_path: str | None = None) -> UnitInfo:
    return UnitInfo(id=row.id, job_id=row.job_id, index=row.idx, repo=row.repo, target=row.target, state=row.state,
                    attempts=row.attempts, leased_by=row.leased_by,
                    progress=Progress.model_validate_json(row.progress) if row.progress else None,
                    result=JobResult.model_validate_json(row.result) if row.result else None, error=row.error,
                    source_path=source_path, retry_note=row.retry_note)


def combined_progress(units: list[UnitRow]) -> Progress | None:
    """The job's progress: its units' counts summed, the best speedup over them, how many targets are done (None
    before any unit reported)."""
    ps = [Progress.model_validate_json(u.progress) for u in units if u.progress]
    if not ps:
        return None
    if len(units) == 1:
        return ps[0]
    done = sum(u.state in TERMINAL_STATES for u in units)
    running = sum(u.state in HELD for u in units)
    speedups = [p.best_speedup for p in ps if p.best_speedup is not None]
    return Progress(round=max((p.round for p in ps), default=0), built=sum(p.built for p in ps),
                    verified=sum(p.verified for p in ps), rejected=sum(p.rejected for p in ps),
                    best_speedup=max(speedups) if speedups else None,
                    message=f"{done} of {len(units)} targets done, {running} running")


def gathered(job_id: str, units: list[UnitRow]) -> tuple[str, JobResult | None, str | None]:
    """The job's final (state, result, error) from its finished units, in target order. A one-unit job takes its
    unit's as they are; otherwise a failed unit becomes its target's "the runner failed" line, and the job fails only
    when every unit did."""
    if len(units) == 1:
        u = units[0]
        result = JobResult.model_validate_json(u.result) if u.result else None
        return u.state, result.model_copy(update={"job_id": job_id}) if result else None, u.error
    targets: list[TargetResult] = []
    errors, environment, ok = [], None, False
    for u in units:
        r = JobResult.model_validate_json(u.result) if u.result else None
        if r is not None and environment is None:
            environment = r.environment
        if u.state == "succeeded" and r is not None:
            ok = True
            targets += r.targets
            continue
        why = (u.error or (r.error if r else None) or u.state).strip()
        errors.append(f"{u.target}: {why.splitlines()[0][:300] if why else u.state}")
        targets += r.targets if r is not None and r.targets else [
            TargetResult(target=u.target, improved=False, message=f"the runner failed on this target: {why[:500]}")]
    error = "; ".join(errors)[:10_000] or None
    result = JobResult(job_id=job_id, ok=ok, targets=targets, environment=environment, error=error)
    return ("succeeded" if ok else "failed"), result, error


class Units(StoreBase):
    """What runners lease: the units of every job, fairly over repositories."""

    # ---- locks (PostgreSQL; SQLite serialises writers itself) ------------------------------------------------------
    def _postgres(self, s: Session) -> bool:
        return s.get_bind().dialect.name == "postgresql"

    def _lock_job(self, s: Session, job_id: str) -> None:
        if self._postgres(s):
            s.execute(select(JobRow.id).where(JobRow.id == job_id).with_for_update())

    def _lock_repo(self, s: Session, repo: str) -> None:
        if self._postgres(s):
            key = int.from_bytes(hashlib.sha256(f"fusebot-units:{repo}".encode()).digest()[:8], "big", signed=True)
            s.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": key})

    # ---- the job follows its units -----------------------------------------------------------------------------
    def _sync_job(self, s: Session, job_id: str, now: datetime) -> None:
        units = list(s.scalars(select(UnitRow).where(UnitRow.job_id == job_id).order_by(UnitRow.idx)))
        if not units:
            return
        progress = combined_progress(units)
        noted = [u for u in units if u.retry_note]
        values: dict[str, Any] = {"progress": progress.model_dump_json() if progress else None,
                                  "attempts": max(u.attempts for u in units),
                                  "retry_note": max(noted, key=lambda u: u.attempts).retry_note if noted else None}
        states = {u.state for u in units}
        if states <= set(TERMINAL_STATES):
            state, result, error = gathered(job_id, units)
            values.update(state=state, result=result.model_dump_json() if result else None, error=error,
                          finished_at=now, lease_expires_at=None)
        else:
            values["state"] = "running" if "running" in states else "leased" if "leased" in states else "queued"
        res = s.execute(update(JobRow).where(JobRow.id == job_id, JobRow.state.in_(ACTIVE_STATES)).values(**values))
        if res.rowcount == 1 and values["state"] in TERMINAL_STATES:
            log.info("job %s finished: %s (%d unit(s) gathered)", job_id, values["state"], len(units))

    def _job_of(self, unit_id: str) -> str:
        with self._s() as s:
            job_id = s.scalar(select(UnitRow.job_id).where(UnitRow.id == unit_id))
        if job_id is None:
            raise LeaseError(f"no live lease on unit {unit_id} for this token")
        return job_id

    # ---- reading -----------------------------------------------------------------------------------------------
    def unit(self, unit_id: str) -> UnitInfo | None:
        with self._s() as s:
            row = s.get(UnitRow, unit_id)
            return _unit_info(row) if row else None

    def units(self, job_id: str) -> list[UnitInfo]:
        """A job's units in target order: each target's state, attempts, runner and progress (the PR's progress)."""
        with self._s() as s:
            q = select(UnitRow).where(UnitRow.job_id == job_id).order_by(UnitRow.idx)
            return [_unit_info(r) for r in s.scalars(q)]

    def unit_counts_by_state(self) -> dict[str, int]:
        with self._s() as s:
            return dict(s.execute(select(UnitRow.state, func.count()).group_by(UnitRow.state)).all())

    # ---- expiry ------------------------------------------------------------------------------------------------
    @writes
    def requeue_expired(self, now: datetime | None = None) -> int:
        """Leases whose holder stopped heart-beating: back to the queue with a note for the next attempt, or failed
        once `max_attempts` leases are spent."""
        now = now or self.clock()
        held = UnitRow.state.in_(HELD) & (UnitRow.lease_expires_at < now)
        with self._s() as s:
            jobs = sorted(set(s.scalars(select(UnitRow.job_id).where(held))))
        failed = requeued = 0
        for job_id in jobs:  # one job at a time, in id order: no two processes lock jobs in opposite orders
            with self._s() as s:
                self._lock_job(s, job_id)
                expired = s.execute(select(UnitRow.id, UnitRow.attempts, UnitRow.leased_by)
                                    .where(held, UnitRow.job_id == job_id)).all()
                for unit_id, attempts, runner in expired:
                    mine = held & (UnitRow.id == unit_id) & (UnitRow.attempts == attempts)  # still that lease
                    values: dict[str, Any] = {"lease_hash": None, "leased_by": None, "lease_expires_at": None}
                    if attempts >= self.max_attempts:
                        values.update(state="failed", error=lost_on_last_attempt(attempts, self.max_attempts, runner),
                                      leased_by=runner, finished_at=now)
                    else:
                        values.update(state="queued", retry_note=lost_worker_note(attempts + 1, self.max_attempts,
                                                                                 runner))
                    if s.execute(update(UnitRow).where(mine).values(**values)).rowcount:
                        failed, requeued = (failed + 1, requeued) if "error" in values else (failed, requeued + 1)
                        log.warning("unit %s: runner %s stopped answering (its lease expired): %s", unit_id, runner,
                                    values.get("error") or f"queued for {values['retry_note']}")
                self._sync_job(s, job_id, now)
                s.commit()
        if failed or requeued:
            log.info("expired unit leases: %d requeued, %d failed", requeued, failed)
        return failed + requeued

    # ---- leasing -----------------------------------------------------------------------------------------------
    def _repo_turns(self, max_per_repo: int | None) -> list[str]:
        """Repositories with queued units, below their limit, the one served longest ago first."""
        with self._s() as s:
            queued = dict(s.execute(select(UnitRow.repo, func.min(UnitRow.created_at))
                                    .where(UnitRow.state == "queued").group_by(UnitRow.repo)).all())
            if not queued:
                return []
            active = dict(s.execute(select(UnitRow.repo, func.count()).where(UnitRow.state.in_(HELD),
                                    UnitRow.repo.in_(list(queued))).group_by(UnitRow.repo)).all())
            served = dict(s.execute(select(UnitRow.repo, func.max(UnitRow.leased_at))
                                    .where(UnitRow.repo.in_(list(queued))).group_by(UnitRow.repo)).all())
        repos = [r for r in queued if max_per_repo is None or active.get(r, 0) < max_per_repo]
        return sorted(repos, key=lambda r: (served.get(r) or _EPOCH, queued[r], r))

    @writes
    def lease(self, runner: str, ttl_seconds: float, now: datetime | None = None, *,
              max_per_repo: int | None = None) -> Lease | None:
        """The next unit for `runner`: the oldest queued unit of the repository whose turn it is. None: nothing to do
        (or every repository with work is at its limit)."""
        now = now or self.clock()
        self.requeue_expired(now)
        for _ in range(10):
            turns = self._repo_turns(max_per_repo)
            if not turns:
                return None
            for repo in turns:
                got = self._lease_in(repo, runner, ttl_seconds, now, max_per_repo)
                if got is not None:
                    return got
        return None

    def _lease_in(self, repo: str, runner: str, ttl_seconds: float, now: datetime,
                  max_per_repo: int | None) -> Lease | None:
        other = aliased(UnitRow)
        with self._s() as s:
            candidates = s.execute(select(UnitRow.id, UnitRow.job_id).where(UnitRow.repo == repo,
                                   UnitRow.state == "queued").order_by(UnitRow.created_at, UnitRow.idx).limit(5)).all()
            for unit_id, job_id in candidates:
                self._lock_repo(s, repo)
                self._lock_job(s, job_id)
                cond = [UnitRow.id == unit_id, UnitRow.state == "queued"]
                if max_per_repo is not None:
                    held = select(func.count()).select_from(other).where(other.repo == repo, other.state.in_(HELD))
                    cond.append(held.scalar_subquery() < max_per_repo)
                token = secrets.token_urlsafe(32)
                expires = now + timedelta(seconds=ttl_seconds)
                res = s.execute(update(UnitRow).where(*cond).values(
                    state="leased", lease_hash=token_hash(token), leased_by=runner, leased_at=now,
                    lease_expires_at=expires, attempts=UnitRow.attempts + 1, progress=None))
                if res.rowcount != 1:
                    s.rollback()
                    continue
                self._sync_job(s, job_id, now)
                s.commit()
                row = s.get(UnitRow, unit_id)
                assert row is not None
                s.refresh(row)
                log.info("unit %s (%s) leased by runner %s (%s%s)", unit_id, row.target or "job", runner,
                         attempt_of(row.attempts, self.max_attempts), f"; {row.retry_note}" if row.retry_note else "")
                return Lease(job=Job.model_validate_json(row.spec), token=token, expires_at=expires)
        return None

    def check_lease(self, unit_id: str, token: str, now: datetime | None = None) -> UnitInfo:
        """The unit (with its job's source path), if `token` is its live lease; LeaseError otherwise."""
        now = now or self.clock()
        with self._s() as s:
            row = s.get(UnitRow, unit_id)
            if (
                row is None
                or row.lease_hash is None
                or not hmac.compare_digest(row.lease_hash, token_hash(token))
                or row.state not in HELD
                or row.lease_expires_at is None
                or row.lease_expires_at < now
            ):
                raise LeaseError(f"no live lease on unit {unit_id} for this token")
            return _unit_info(row, s.scalar(select(JobRow.source_path).where(JobRow.id == row.job_id)))

    # ---- the holder's calls ------------------------------------------------------------------------------------
    @writes
    def heartbeat(self, unit_id: str, token: str, progress: Progress, ttl_seconds: float,
                  now: datetime | None = None) -> str:
        """Extend the lease and store progress. Returns the unit's state ('cancelled' tells the runner to stop)."""
        now = now or self.clock()
        job_id = self._job_of(unit_id)
        with self._s() as s:
            self._lock_job(s, job_id)
            res = s.execute(
                update(UnitRow)
                .where(UnitRow.id == unit_id, UnitRow.lease_hash == token_hash(token), UnitRow.state.in_(HELD),
                       UnitRow.lease_expires_at >= now)
                .values(state="running", progress=progress.model_dump_json(),
                        lease_expires_at=now + timedelta(seconds=ttl_seconds))
            )
            if res.rowcount == 1:
                self._sync_job(s, job_id, now)
            s.commit()
            if res.rowcount == 1:
                return "running"
            row = s.get(UnitRow, unit_id)
            if row is not None and row.state == "cancelled" and row.lease_hash == token_hash(token):
                return "cancelled"
        raise LeaseError(f"no live lease on unit {unit_id} for this token")

    def complete(self, unit_id: str, token: str, result: JobResult, now: datetime | None = None) -> bool:
        """Record the runner's result exactly once. True when recorded now, False when it was already recorded
        (a retried upload); LeaseError when the caller's lease is not the one holding the unit."""
        if result.job_id != unit_id:
            raise ValueError("result.job_id does not match the unit")
        now = now or self.clock()
        state = "succeeded" if result.ok else "failed"
        return self._finish(unit_id, token, now, state=state, result=result.model_dump_json(), error=result.error)

    def fail(self, unit_id: str, token: str, error: str, now: datetime | None = None) -> bool:
        return self._finish(unit_id, token, self.clock() if now is None else now, state="failed", error=error[:10_000])

    @writes
    def _finish(self, unit_id: str, token: str, now: datetime, **values: Any) -> bool:
        job_id = self._job_of(unit_id)
        with self._s() as s:
            self._lock_job(s, job_id)
            res = s.execute(
                update(UnitRow)
                .where(UnitRow.id == unit_id, UnitRow.lease_hash == token_hash(token), UnitRow.state.in_(HELD))
                .values(finished_at=now, lease_expires_at=None, **values)
            )
            if res.rowcount == 1:
                self._sync_job(s, job_id, now)
            s.commit()
            if res.rowcount == 1:
                log.info("unit %s finished: %s", unit_id, values["state"])
                return True
            row = s.get(UnitRow, unit_id)
            if row is not None and row.lease_hash == token_hash(token) and row.state in TERMINAL_STATES:
                return False  # the same lease already finished it (or it was cancelled under it)
        raise LeaseError(f"no live lease on unit {unit_id} for this token")

    @writes
    def release(self, unit_id: str, token: str, now: datetime | None = None) -> bool:
        """The runner gives the unit back (it is shutting down): straight back to the queue, for any worker."""
        try:
            job_id = self._job_of(unit_id)
        except LeaseError:
            return False
        with self._s() as s:
            self._lock_job(s, job_id)
            row = s.get(UnitRow, unit_id)
            note = given_back_note(row.attempts + 1, self.max_attempts, row.leased_by) if row is not None else None
            res = s.execute(
                update(UnitRow)
                .where(UnitRow.id == unit_id, UnitRow.lease_hash == token_hash(token), UnitRow.state.in_(HELD))
                .values(state="queued", lease_hash=None, leased_by=None, lease_expires_at=None, retry_note=note)
            )
            if res.rowcount == 1:
                self._sync_job(s, job_id, now or self.clock())
            s.commit()
            return res.rowcount == 1

    # ---- upgrade -------------------------------------------------------------------------------------------------
    @writes
    def backfill_units(self) -> int:
        """Units for active jobs recorded before jobs had units (a bot upgraded with work queued). Returns how many
        jobs got theirs."""
        with self._s() as s:
            rows = list(s.scalars(select(JobRow).where(JobRow.state.in_(ACTIVE_STATES),
                                                       ~exists().where(UnitRow.job_id == JobRow.id))))
        done = 0
        for row in rows:
            job = Job.model_validate_json(row.spec)
            with self._s() as s:
                for i, (unit_id, target, spec) in enumerate(split_job(job)):
                    s.add(UnitRow(id=unit_id, job_id=job.id, idx=i, repo=job.repo, target=target, state="queued",
                                  spec=spec.model_dump_json(), created_at=row.created_at))
                s.execute(update(JobRow).where(JobRow.id == job.id, JobRow.state.in_(ACTIVE_STATES))
                          .values(state="queued", lease_hash=None, leased_by=None, lease_expires_at=None))
                try:
                    s.commit()
                    done += 1
                except IntegrityError:  # another process did it
                    s.rollback()
        if done:
            log.info("units recorded for %d job(s) queued before units existed", done)
        return done
