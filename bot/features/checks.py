"""check_run events on fusebot's own check runs: re-run, and the `stop` button."""

from __future__ import annotations

import logging

from bot.context import Context
from bot.features.triggers import rerun
from bot.github.platform import can_write
from bot.github.routing import Router
from bot.github.webhooks import Event
from bot.store.jobs import JobInfo

log = logging.getLogger(__name__)
router = Router()


def _job_and_permission(ev: Event, ctx: Context) -> JobInfo | None:
    run = ev.data["check_run"]
    job = ctx.store.find_by_check_run(run["id"])
    if job is None:
        log.info("check run %s is not a fusebot job's: ignored", run["id"])
        return None
    inst = ev.installation_id or job.installation_id or 0
    if not can_write(ctx.platform(inst, job.repo), ev.sender or ""):
        log.warning("check run %s: %s by %s ignored: no write access", run["id"], ev.action, ev.sender)
        return None
    return job


@router.register("check_run", "rerequested")
def rerequested(ev: Event, ctx: Context) -> None:
    job = _job_and_permission(ev, ctx)
    if job is not None:
        info = rerun(ctx, delivery_id=ev.delivery_id, previous=job, installation_id=ev.installation_id or 0)
        log.info("check run re-requested: job %s re-run as %s", job.id, info.id)


@router.register("check_run", "requested_action")
def requested_action(ev: Event, ctx: Context) -> None:
    identifier = (ev.data.get("requested_action") or {}).get("identifier")
    job = _job_and_permission(ev, ctx)
    if job is None:
        return
    if identifier == "stop":
        ctx.store.cancel(job.repo, job_id=job.id)
    elif identifier == "rerun":
        rerun(ctx, delivery_id=ev.delivery_id, previous=job, installation_id=ev.installation_id or 0)
    else:
        log.info("check run action %r: unknown, ignored", identifier)
