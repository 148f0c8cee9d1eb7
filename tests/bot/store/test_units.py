"""Units: a job's targets leased by many runners at once, gathered into one result exactly once, on SQLite and on a
real PostgreSQL server (the `db_url` fixture)."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest
from sqlalchemy import inspect, text

from bot.store.db import JobRow, init_db, utcnow
from bot.store.jobs import LeaseError, job_id_for
from bot.store.store import Store
from runner.contract import Environment, Job, JobResult, Progress, TargetResult, TargetSpec


@pytest.fixture
def store(db_url: str) -> Store:
    return Store(init_db(db_url), max_attempts=2, claim_seconds=60)


def job_of(key: str, n: int, repo: str = "o/r", kind: str = "search") -> Job:
    targets = [TargetSpec(name=f"m.T{i}", file=f"m{i}.py", class_name=f"T{i}") for i in range(n)]
    return Job(id=job_id_for(key), repo=repo, sha="a" * 40, pr_number=7, targets=targets, kind=kind)


def enqueue(store: Store, key: str, n: int, repo: str = "o/r") -> Job:
    job = job_of(key, n, repo)
    store.enqueue(job, key, installation_id=1)
    return job


def result_for(lease, ms: float = 1.0) -> JobResult:
    env = Environment(device="cuda", gpu="fake", torch="2", python="3", fusebot="0")
    return JobResult(job_id=lease.job.id, ok=True, environment=env, targets=[
        TargetResult(target=t.name, improved=True, message=f"{ms} ms") for t in lease.job.targets])


def test_a_jobs_targets_are_units_that_runners_lease_at_once(store):
    job = enqueue(store, "d1:0", 3)
    assert [u.target for u in store.units(job.id)] == ["m.T0", "m.T1", "m.T2"]
    leases = [store.lease(f"gpu-{i}", 30) for i in range(3)]
    assert store.lease("gpu-3", 30) is None  # three targets: three units, no more
    assert sorted(x.job.id for x in leases) == [f"{job.id}.{i}" for i in range(3)]
    assert all(len(x.job.targets) == 1 and x.job.repo == job.repo and x.job.sha == job.sha for x in leases)
    assert store.get(job.id).state == "leased"
    assert store.heartbeat(leases[1].job.id, leases[1].token, Progress(round=1, built=2, verified=1), 30) == "running"
    assert store.heartbeat(leases[2].job.id, leases[2].token, Progress(round=2, built=3, best_speedup=1.5), 30)
    info = store.get(job.id)
    assert info.state == "running" and info.progress.built == 5 and info.progress.round == 2
    assert info.progress.best_speedup == 1.5 and info.progress.message == "0 of 3 targets done, 3 running"
    assert [u.state for u in store.units(job.id)] == ["leased", "running", "running"]
    assert {u.leased_by for u in store.units(job.id)} == {"gpu-0", "gpu-1", "gpu-2"}


def test_results_are_gathered_in_target_order_exactly_once(store):
    job = enqueue(store, "d1:0", 3)
    leases = sorted((store.lease(f"gpu-{i}", 30) for i in range(3)), key=lambda x: x.job.id)
    for x in (leases[2], leases[0]):  # finishing out of order
        assert store.complete(x.job.id, x.token, result_for(x)) is True
        assert store.get(job.id).state in ("leased", "running")  # not gathered before the last unit
    assert store.complete(leases[1].job.id, leases[1].token, result_for(leases[1])) is True
    info = store.get(job.id)
    assert info.state == "succeeded" and info.result.job_id == job.id and info.result.ok
    assert [t.target for t in info.result.targets] == ["m.T0", "m.T1", "m.T2"]
    assert info.result.environment.gpu == "fake"
    finished = info.progress
    assert store.complete(leases[1].job.id, leases[1].token, result_for(leases[1], 2.0)) is False  # a retried upload
    again = store.get(job.id)
    assert again.result == info.result and again.progress == finished  # gathered once: nothing moved


def test_units_finishing_at_once_are_gathered_once(store):
    job = enqueue(store, "d1:0", 8)
    leases = [store.lease(f"gpu-{i}", 60) for i in range(8)]
    barrier = threading.Barrier(8)
    recorded: list[bool] = []

    def finish(x) -> None:
        barrier.wait()
        recorded.append(store.complete(x.job.id, x.token, result_for(x)))

    threads = [threading.Thread(target=finish, args=(x,)) for x in leases]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    info = store.get(job.id)
    assert recorded == [True] * 8 and info.state == "succeeded"
    assert [t.target for t in info.result.targets] == [f"m.T{i}" for i in range(8)]


def test_a_dead_workers_unit_is_finished_by_another(store):
    """Worker A dies mid-unit: its lease expires, worker B takes that unit (and only that one) and finishes the job;
    A's late result is refused."""
    job = enqueue(store, "d1:0", 2)
    t0 = utcnow()
    a = store.lease("gpu-a", 10, now=t0)
    b = store.lease("gpu-b", 10, now=t0)
    assert store.complete(b.job.id, b.token, result_for(b), now=t0 + timedelta(seconds=2))
    assert store.lease("gpu-b", 10, now=t0 + timedelta(seconds=5)) is None  # A's lease still holds
    again = store.lease("gpu-b", 10, now=t0 + timedelta(seconds=11))  # expired: requeued, and leased again
    assert again.job.id == a.job.id and again.token != a.token
    assert store.get(job.id).state == "leased" and store.get(job.id).attempts == 2
    with pytest.raises(LeaseError):
        store.complete(a.job.id, a.token, result_for(a), now=t0 + timedelta(seconds=12))
    assert store.complete(again.job.id, again.token, result_for(again, 3.0), now=t0 + timedelta(seconds=12))
    info = store.get(job.id)
    assert info.state == "succeeded" and [t.message for t in info.result.targets] == ["3.0 ms", "1.0 ms"]  # T0 again


def test_a_failed_unit_is_its_targets_line_and_all_failed_fails_the_job(store):
    one = enqueue(store, "d1:0", 2)
    x, y = sorted((store.lease("gpu-a", 30), store.lease("gpu-b", 30)), key=lambda x: x.job.id)
    assert store.fail(x.job.id, x.token, "GPU fell off the bus")
    store.complete(y.job.id, y.token, result_for(y))
    info = store.get(one.id)
    assert info.state == "succeeded" and info.result.ok
    assert info.result.targets[0].improved is False and "GPU fell off the bus" in info.result.targets[0].message
    two = enqueue(store, "d2:0", 2)
    for _ in range(2):
        x = store.lease("gpu-a", 30)
        store.fail(x.job.id, x.token, "out of memory")
    info = store.get(two.id)
    assert info.state == "failed" and "out of memory" in info.error and len(info.result.targets) == 2


def test_expiry_on_every_attempt_fails_the_unit_and_the_job_goes_on(store):
    job = enqueue(store, "d1:0", 2)
    t0 = utcnow()
    first = store.lease("gpu-a", 10, now=t0)
    other = store.lease("gpu-b", 100, now=t0)
    store.lease("gpu-a", 10, now=t0 + timedelta(seconds=11))  # attempt 2 of max_attempts=2
    assert store.requeue_expired(now=t0 + timedelta(seconds=30)) == 1
    assert store.unit(first.job.id).state == "failed" and store.get(job.id).state == "leased"
    store.complete(other.job.id, other.token, result_for(other), now=t0 + timedelta(seconds=31))
    info = store.get(job.id)
    assert info.state == "succeeded" and "expired" in info.result.targets[0].message


def test_cancel_stops_every_unit(store):
    job = enqueue(store, "d1:0", 3)
    x = store.lease("gpu-a", 30)
    assert store.cancel("o/r", pr_number=7) == [job.id]
    assert {u.state for u in store.units(job.id)} == {"cancelled"}
    assert store.heartbeat(x.job.id, x.token, Progress(), 30) == "cancelled"
    assert store.complete(x.job.id, x.token, result_for(x)) is False
    assert store.lease("gpu-b", 30) is None and store.get(job.id).state == "cancelled"


def test_release_puts_the_unit_back_and_the_job_back_to_queued(store):
    job = enqueue(store, "d1:0", 2)
    x = store.lease("gpu-a", 300)
    assert store.release(x.job.id, x.token) and not store.release(x.job.id, x.token)
    assert store.get(job.id).state == "queued" and store.unit(x.job.id).state == "queued"
    assert store.lease("gpu-b", 300).job.id == x.job.id  # the oldest unit again, at once


def test_repositories_take_turns(store):
    enqueue(store, "a:0", 4, repo="o/busy")
    enqueue(store, "b:0", 2, repo="o/quiet")
    order = [store.lease(f"gpu-{i}", 60).job.repo for i in range(6)]
    assert order == ["o/busy", "o/quiet", "o/busy", "o/quiet", "o/busy", "o/busy"]


def test_per_repository_limit(store):
    enqueue(store, "a:0", 5, repo="o/busy")
    got = [store.lease(f"gpu-{i}", 60, max_per_repo=2) for i in range(3)]
    assert [g.job.repo for g in got[:2]] == ["o/busy", "o/busy"] and got[2] is None  # at its limit
    enqueue(store, "b:0", 1, repo="o/quiet")
    assert store.lease("gpu-3", 60, max_per_repo=2).job.repo == "o/quiet"  # another repository still gets a GPU
    store.complete(got[0].job.id, got[0].token, result_for(got[0]))
    assert store.lease("gpu-0", 60, max_per_repo=2).job.repo == "o/busy"  # a place came free


def test_per_repository_limit_holds_under_concurrent_leases(store):
    enqueue(store, "a:0", 12, repo="o/busy")
    got: list[str] = []
    lock = threading.Lock()
    barrier = threading.Barrier(8)

    def take() -> None:
        barrier.wait()
        for _ in range(3):
            x = store.lease(threading.current_thread().name, 60, max_per_repo=3)
            if x is not None:
                with lock:
                    got.append(x.job.id)

    threads = [threading.Thread(target=take, name=f"r{i}") for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(got) == 3 == len(set(got))
    assert store.unit_counts_by_state() == {"leased": 3, "queued": 9}


def test_kernel_jobs_and_one_target_searches_are_one_unit_with_the_jobs_id(store):
    bench = job_of("k:0", 0, kind="benchmark").model_copy(update={"kernels": ["a", "b"]})
    store.enqueue(bench, "k:0", installation_id=1)
    single = enqueue(store, "s:0", 1)
    assert [u.id for u in store.units(bench.id)] == [bench.id] and [u.id for u in store.units(single.id)] == [single.id]
    x = store.lease("gpu-a", 30)
    assert x.job == bench  # the runner sees the job itself


def test_jobs_recorded_before_units_get_theirs(store):
    job = job_of("old:0", 2)
    with store.sessions() as s:  # a job row as a bot without units wrote it
        s.add(JobRow(id=job.id, dedupe_key="old:0", repo=job.repo, sha=job.sha, trigger="label", state="queued",
                     spec=job.model_dump_json()))
        s.commit()
    assert store.lease("gpu-a", 30) is None
    assert store.backfill_units() == 1 and store.backfill_units() == 0
    assert store.lease("gpu-a", 30).job.id == f"{job.id}.0"


# ---- lost workers: injected clocks -------------------------------------------------------------------------------


class Clock:
    """The store's "now", moved by the test."""

    def __init__(self) -> None:
        self.now = utcnow()

    def __call__(self):
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


def test_heartbeats_keep_a_long_units_lease_and_a_silent_worker_loses_it(store):
    """A unit runs ten times its lease while its worker beats; once the worker stops answering, the lease lapses
    after one TTL and another worker takes the unit, told which attempt it is and why; the first worker's next
    heartbeat is refused."""
    clock = Clock()
    store.clock = clock
    job = enqueue(store, "d1:0", 1)
    a = store.lease("gpu-a", 60)
    for _ in range(15):  # 600 s of work, a heartbeat every 40 s
        clock.advance(40)
        assert store.requeue_expired() == 0
        assert store.heartbeat(a.job.id, a.token, Progress(round=1), 60) == "running"
        assert store.lease("gpu-b", 60) is None
    assert store.unit(a.job.id).leased_by == "gpu-a" and store.get(job.id).attempts == 1
    clock.advance(59)  # gpu-a stops answering: the lease holds for one TTL after its last beat
    assert store.requeue_expired() == 0 and store.lease("gpu-b", 60) is None
    clock.advance(2)
    assert store.requeue_expired() == 1
    note = "attempt 2 of 2: the previous worker stopped answering (runner gpu-a)"
    info = store.get(job.id)
    assert (info.state, info.attempts, info.retry_note) == ("queued", 1, note)
    b = store.lease("gpu-b", 60)
    assert b.job.id == a.job.id and store.unit(b.job.id).retry_note == note
    assert (store.get(job.id).state, store.get(job.id).attempts, store.get(job.id).retry_note) == ("leased", 2, note)
    with pytest.raises(LeaseError):
        store.heartbeat(a.job.id, a.token, Progress(round=2), 60)  # gpu-a is back: refused, it must stop
    assert store.heartbeat(b.job.id, b.token, Progress(round=1), 60) == "running"


def test_a_unit_whose_worker_is_lost_on_every_attempt_fails_with_the_reason(store):
    clock = Clock()
    store.clock = clock
    job = enqueue(store, "d1:0", 1)
    for runner in ("gpu-a", "gpu-b"):  # max_attempts=2
        assert store.lease(runner, 60) is not None
        clock.advance(61)
        assert store.requeue_expired() == 1
    info = store.get(job.id)
    assert info.state == "failed" and info.attempts == 2
    assert info.error == ("attempt 2 of 2: the worker stopped answering (runner gpu-b) and its lease expired; "
                          "no attempts are left")
    assert store.lease("gpu-c", 60) is None  # no third lease: it does not loop


def test_a_unit_given_back_says_so_on_its_next_attempt(store):
    job = enqueue(store, "d1:0", 2)
    x = store.lease("gpu-a", 60)
    assert store.release(x.job.id, x.token)
    note = "attempt 2 of 2: the previous worker was stopped and gave it back (runner gpu-a)"
    assert store.unit(x.job.id).retry_note == note and store.get(job.id).retry_note == note
    assert store.unit(f"{job.id}.1").retry_note is None  # the other target has not been retried


def test_a_database_from_before_a_column_gets_it_and_keeps_its_queue(db_url):
    sessions = init_db(db_url)
    store = Store(sessions, max_attempts=2)
    job = enqueue(store, "d1:0", 1)
    engine = sessions.kw["bind"]
    with engine.begin() as conn:  # the tables as an older bot created them
        for table in ("units", "jobs"):
            conn.execute(text(f"ALTER TABLE {table} DROP COLUMN retry_note"))
    again = Store(init_db(db_url), max_attempts=2)
    assert all("retry_note" in {c["name"] for c in inspect(engine).get_columns(t)} for t in ("units", "jobs"))
    assert again.get(job.id).state == "queued" and again.lease("gpu-a", 60).job.id == job.id
