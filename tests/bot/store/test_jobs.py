"""The job state machine and the inbox, on SQLite and on a real PostgreSQL server."""

from __future__ import annotations

import threading
from datetime import timedelta

import pytest

from bot.github.webhooks import Event
from bot.store.db import init_db, utcnow
from bot.store.jobs import LeaseError, job_id_for
from bot.store.store import Store
from runner.contract import Job, JobResult, Progress, TargetSpec


@pytest.fixture
def store(db_url: str) -> Store:
    return Store(init_db(db_url), max_attempts=2, claim_seconds=60)


def make_job(key: str, pr: int | None = 7) -> Job:
    return Job(id=job_id_for(key), repo="o/r", sha="a" * 40, pr_number=pr,
               targets=[TargetSpec(name="m.A", file="m.py", class_name="A")])


def enqueue(store: Store, key: str, pr: int | None = 7):
    return store.enqueue(make_job(key, pr), key, installation_id=1)


def test_enqueue_is_idempotent_per_key(store):
    a, created_a = enqueue(store, "d1:0")
    b, created_b = enqueue(store, "d1:0")
    assert created_a and not created_b and a.id == b.id
    assert len(store.list_jobs()) == 1
    with pytest.raises(ValueError):
        store.enqueue(make_job("other"), "d1:1", installation_id=1)


def test_lease_heartbeat_complete_exactly_once(store):
    enqueue(store, "d1:0")
    lease = store.lease("gpu-a", ttl_seconds=30)
    assert lease is not None and store.get(lease.job.id).state == "leased"
    assert store.lease("gpu-b", ttl_seconds=30) is None  # nothing else queued
    assert store.heartbeat(lease.job.id, lease.token, Progress(round=1, built=3), 30) == "running"
    assert store.get(lease.job.id).progress.built == 3
    result = JobResult(job_id=lease.job.id, ok=True)
    assert store.complete(lease.job.id, lease.token, result) is True
    assert store.complete(lease.job.id, lease.token, result) is False  # a retried upload records nothing
    info = store.get(lease.job.id)
    assert info.state == "succeeded" and info.result == result
    with pytest.raises(LeaseError):
        store.heartbeat(lease.job.id, lease.token, Progress(), 30)


def test_wrong_lease_token_is_refused_everywhere(store):
    enqueue(store, "d1:0")
    enqueue(store, "d2:0")
    a = store.lease("gpu-a", 30)
    b = store.lease("gpu-b", 30)
    assert a.job.id != b.job.id
    with pytest.raises(LeaseError):
        store.check_lease(a.job.id, b.token)  # another job's credentials
    with pytest.raises(LeaseError):
        store.complete(a.job.id, b.token, JobResult(job_id=a.job.id, ok=True))
    with pytest.raises(LeaseError):
        store.heartbeat(a.job.id, "forged", Progress(), 30)
    assert store.check_lease(a.job.id, a.token).id == a.job.id


def test_expired_lease_goes_back_to_the_queue_then_fails(store):
    enqueue(store, "d1:0")
    t0 = utcnow()
    first = store.lease("gpu-a", 10, now=t0)
    assert store.lease("gpu-b", 10, now=t0 + timedelta(seconds=5)) is None  # still held
    second = store.lease("gpu-b", 10, now=t0 + timedelta(seconds=11))  # expired: requeued and re-leased
    assert second is not None and second.job.id == first.job.id and second.token != first.token
    with pytest.raises(LeaseError):  # the first holder's late result is not recorded
        late = t0 + timedelta(seconds=12)
        store.complete(first.job.id, first.token, JobResult(job_id=first.job.id, ok=True), now=late)
    # max_attempts=2: a second expiry fails the job instead of looping forever
    assert store.requeue_expired(now=t0 + timedelta(seconds=30)) == 1
    info = store.get(first.job.id)
    assert info.state == "failed" and "expired" in info.error


def test_cancel_by_pr_and_heartbeat_reports_it(store):
    enqueue(store, "d1:0", pr=7)
    enqueue(store, "d2:0", pr=8)
    lease = store.lease("gpu-a", 30)
    assert lease.job.pr_number == 7
    assert store.cancel("o/r", pr_number=7) == [lease.job.id]
    assert store.heartbeat(lease.job.id, lease.token, Progress(), 30) == "cancelled"
    assert store.complete(lease.job.id, lease.token, JobResult(job_id=lease.job.id, ok=True)) is False
    assert store.get(lease.job.id).state == "cancelled"
    assert {j.state for j in store.list_jobs(pr_number=8)} == {"queued"}


def test_release_requeues_at_once(store):
    enqueue(store, "d1:0")
    lease = store.lease("gpu-a", 300)
    assert store.release(lease.job.id, lease.token)
    again = store.lease("gpu-b", 300)
    assert again is not None and again.job.id == lease.job.id


def test_concurrent_leases_never_share_a_job(store):
    for i in range(30):
        enqueue(store, f"d{i}:0")
    got: list[str] = []
    lock = threading.Lock()

    def take() -> None:
        while (lease := store.lease(threading.current_thread().name, 60)) is not None:
            with lock:
                got.append(lease.job.id)

    threads = [threading.Thread(target=take, name=f"r{i}") for i in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(got) == sorted(j.id for j in store.list_jobs()) and len(set(got)) == 30


def test_inbox_dedupes_claims_once_and_retries(store):
    ev = Event("pull_request", "deliv-1", {"action": "labeled"})
    assert store.record_delivery(ev) is True
    assert store.record_delivery(ev) is False
    claimed = store.claim_delivery()
    assert claimed == ev
    assert store.claim_delivery() is None  # claimed, not handed out twice
    store.finish_delivery("deliv-1", error="GitHub down")
    assert store.delivery_status("deliv-1") == "pending"
    assert store.claim_delivery() is None  # backing off
    assert store.claim_delivery(now=utcnow() + timedelta(minutes=10)) == ev
    store.finish_delivery("deliv-1", error="still down")  # attempts spent (max 2)
    assert store.delivery_status("deliv-1") == "failed"


def test_lapsed_claim_is_taken_again(store):
    """A bot that died while handling a delivery: after the claim lapses, another pass handles it."""
    store.record_delivery(Event("pull_request", "deliv-2", {}))
    assert store.claim_delivery() is not None
    assert store.claim_delivery(now=utcnow() + timedelta(seconds=61)) is not None
