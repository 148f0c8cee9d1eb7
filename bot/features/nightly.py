"""Nightly runs: each installed repository on its own cron and time zone (default daily at 03:00 UTC).

`tick(now)` is cheap and idempotent: a due repository becomes one internal delivery keyed by its time slot
(`schedule:<repo>:<slot>`), so two ticks, two bot processes or a restart never start a slot twice. That delivery's
handler (`nightly`) runs on the default branch's head: a search of every marked target, and hygiene (the merged
fusebot kernels re-verified, the stale ones removed by a PR) when the branch holds any fusebot kernels.
"""

from __future__ import annotations

import logging
import zoneinfo
from datetime import UTC, datetime

from croniter import croniter

from bot.context import Context
from bot.features.triggers import start_job, start_kernel_job
from bot.github.routing import Router
from bot.github.webhooks import Event
from bot.store.db import utcnow
from bot.store.store import Store

log = logging.getLogger(__name__)
router = Router()

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


@router.register(SCHEDULE_EVENT)
def nightly(ev: Event, ctx: Context) -> None:
    repo, inst = ev.repo or "", ev.installation_id or 0
    host = ctx.platform(inst, repo)
    branch = host.default_branch()
    sha = host.head_sha(branch)
    started = start_job(
        ctx, delivery_id=ev.delivery_id, repo=repo, installation_id=inst, sha=sha, ref=branch, trigger="schedule"
    )
    if started.config is not None:  # the default branch's config sets the schedule from now on
        s = started.config.schedule
        slot = datetime.fromisoformat(ev.data["slot"])
        following = next_fire(s.cron, s.timezone, max(slot, utcnow()))
        ctx.store.set_schedule(repo, enabled=s.enabled, cron=s.cron, timezone=s.timezone, next_run_at=following)
        start_kernel_job(ctx, kind="hygiene", delivery_id=ev.delivery_id, repo=repo, installation_id=inst, sha=sha,
                         ref=branch, trigger="schedule", index=1)
