"""The nightly scheduler: cron in the repository's time zone, one delivery per slot however often it ticks."""

from __future__ import annotations

from datetime import UTC, datetime

from bot.features.nightly import SCHEDULE_EVENT, next_fire, tick
from bot.store.db import init_db
from bot.store.store import Store


def test_next_fire_in_the_repository_time_zone():
    # 02:30 in Berlin is 01:30 UTC in winter and 00:30 UTC in summer
    assert next_fire("30 2 * * *", "Europe/Berlin", datetime(2026, 1, 10, 12, tzinfo=UTC)) == datetime(
        2026, 1, 11, 1, 30, tzinfo=UTC)
    assert next_fire("30 2 * * *", "Europe/Berlin", datetime(2026, 7, 10, 12, tzinfo=UTC)) == datetime(
        2026, 7, 11, 0, 30, tzinfo=UTC)
    assert next_fire("0 3 * * *", "UTC", datetime(2026, 1, 1, 3, 0, tzinfo=UTC)) == datetime(
        2026, 1, 2, 3, 0, tzinfo=UTC)  # strictly after


def test_tick_queues_each_slot_once(tmp_path):
    store = Store(init_db(f"sqlite:///{tmp_path / 's.db'}"))
    store.upsert_repo("o/r", 7)
    store.upsert_repo("o/off", 7)
    store.set_schedule("o/off", enabled=False, cron="0 3 * * *", timezone="UTC", next_run_at=None)
    t0 = datetime(2026, 3, 1, 12, tzinfo=UTC)
    assert tick(store, t0) == []  # first sight: schedule the next slot, run nothing now
    [repo] = [r for r in store.repos() if r.full_name == "o/r"]
    assert repo.next_run_at == datetime(2026, 3, 2, 3, tzinfo=UTC)
    assert tick(store, datetime(2026, 3, 2, 2, 59, tzinfo=UTC)) == []
    due = datetime(2026, 3, 2, 3, 0, 30, tzinfo=UTC)
    assert tick(store, due) == ["schedule:o/r:2026-03-02T03:00:00+00:00"]
    assert tick(store, due) == []  # a second tick (or a second bot process) adds nothing
    ev = store.claim_delivery()
    assert ev is not None and ev.name == SCHEDULE_EVENT and ev.data["slot"] == "2026-03-02T03:00:00+00:00"
    assert ev.installation_id == 7 and ev.repo == "o/r"
    assert [r.next_run_at for r in store.repos() if r.full_name == "o/r"] == [datetime(2026, 3, 3, 3, tzinfo=UTC)]
