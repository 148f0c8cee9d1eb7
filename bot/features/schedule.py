"""The nightly run on the default branch's head: a search of every marked target, and hygiene (the merged fusebot
kernels re-verified, the stale ones removed by a PR) when the branch holds any fusebot kernels."""

from __future__ import annotations

import logging
from datetime import datetime

from bot.context import Context
from bot.features.nightly import SCHEDULE_EVENT, next_fire
from bot.features.triggers import start_job, start_kernel_job
from bot.github import client
from bot.github.routing import Router
from bot.github.webhooks import Event
from bot.store.db import utcnow

log = logging.getLogger(__name__)
router = Router()


@router.register(SCHEDULE_EVENT)
def nightly(ev: Event, ctx: Context) -> None:
    repo, inst = ev.repo or "", ev.installation_id or 0
    branch, sha = client.default_branch_head(ctx.gh(inst), repo)
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
