"""Nightly runs: each installed repository on its own cron and time zone (default daily at 03:00 UTC).

`tick(now)` is cheap and idempotent: a due repository becomes one internal delivery keyed by its time slot
(`schedule:<repo>:<slot>`), so two ticks, two bot processes or a restart never start a slot twice.
"""

from __future__ import annotations

import logging
import zoneinfo
from datetime import UTC, datetime

from croniter import croniter

from bot.github.webhooks import Event
from bot.store.jobs import Store

log = logging.getLogger(__name__)

SCHEDULE_EVENT = "fusebot.schedule"


def next_fire(cron: str, timezone: str, after: datetime) -> datetime:
    """The first time strictly after `after` that `cron` fires in `timezone`, as aware UTC."""
    tz = zoneinfo.ZoneInfo(timezone)
    it = croniter(cron, after.astimezone(tz))
    return it.get_next(datetime).astimezone(UTC)


def tick(store: Store, now: datetime) -> list[str]:
    """Queue a schedule delivery for every repository that is due. Returns the delivery ids queued now."""
    queued = []
    for repo in store.repos():
        if not repo.schedule_enabled:
            continue
        if repo.next_run_at is None:
            store.advance_schedule(repo.full_name, None, next_fire(repo.cron, repo.timezone, now))
            continue
        if now < repo.next_run_at:
            continue
        slot = repo.next_run_at
        ev = Event(
            name=SCHEDULE_EVENT,
            delivery_id=f"schedule:{repo.full_name}:{slot.isoformat()}",
            data={
                "action": "tick",
                "repository": {"full_name": repo.full_name},
                "installation": {"id": repo.installation_id},
                "slot": slot.isoformat(),
            },
        )
        if store.record_delivery(ev):  # first: a crash between the two steps re-records (deduped), never skips
            queued.append(ev.delivery_id)
            log.info("nightly run of %s queued for slot %s", repo.full_name, slot.isoformat())
        store.advance_schedule(repo.full_name, slot, next_fire(repo.cron, repo.timezone, now))
    return queued
