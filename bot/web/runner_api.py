"""The runner API: runners pull work, so they can sit behind NAT and never hold GitHub credentials.

What a runner leases is a unit (bot/store/units.py): one target of a job, handed out as a Job narrowed to that target
whose `id` is the unit's (a one-target, benchmark or hygiene job is one unit with the job's own id). Every call
carries the runner's bearer token (one per runner, from settings). Calls about one unit also carry the lease token the
runner got when it leased that unit (`X-Fusebot-Lease`): a runner can touch only the unit it holds.

    POST /runner/v1/lease                     -> 200 {job, unit, lease_token, lease_expires_at, lease_ttl_seconds} | 204
    POST /runner/v1/jobs/{id}/heartbeat       Progress -> {state}   (state "cancelled": stop working)
    GET  /runner/v1/jobs/{id}/source          -> the job's source, .tar.gz
    POST /runner/v1/jobs/{id}/result          JobResult -> {recorded}
    POST /runner/v1/jobs/{id}/fail            {error} -> {recorded}
    POST /runner/v1/jobs/{id}/release         -> {released}   (shutting down: back to the queue now)

`{id}` is the leased unit's id (`job.id` in the lease). `unit` says which job and target it is, and which attempt:
{job_id, index, target, attempts, retry_note} (`retry_note`: why an earlier attempt did not finish, or null).

A lease lasts `lease_ttl_seconds` past the last heartbeat. A runner that stops heart-beating (killed, its machine
gone) loses the unit to the queue (bot/store/units.py `requeue_expired`); its next heartbeat is then refused (409)
and it stops that unit's work.
"""

# no `from __future__ import annotations`: FastAPI must see the local Annotated aliases below as objects

import hmac
import logging
from pathlib import Path
from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Response
from fastapi.responses import FileResponse, JSONResponse
from pydantic import BaseModel

from bot.context import Context
from bot.store.jobs import LeaseError
from runner.contract import JobResult, Progress

log = logging.getLogger(__name__)
LEASE_HEADER = "X-Fusebot-Lease"


class FailIn(BaseModel):
    error: str


def make_router(ctx: Context) -> APIRouter:
    tokens = {name: t.get_secret_value().encode() for name, t in ctx.settings.runner_tokens.items()}
    ttl = ctx.settings.lease_ttl_seconds
    per_repo = ctx.settings.max_units_per_repo
    store, metrics = ctx.store, ctx.metrics

    def runner_name(authorization: Annotated[str | None, Header()] = None) -> str:
        given = (authorization or "").removeprefix("Bearer ").encode()
        match = None
        for name, token in tokens.items():  # compare with every token: timing says nothing about which
            if hmac.compare_digest(given, token):
                match = name
        if not authorization or not authorization.startswith("Bearer ") or match is None:
            metrics.runner_calls.labels("auth", "denied").inc()
            raise HTTPException(401, "unknown runner token", headers={"WWW-Authenticate": "Bearer"})
        return match

    Runner = Annotated[str, Depends(runner_name)]
    LeaseToken = Annotated[str, Header(alias=LEASE_HEADER)]
    r = APIRouter(prefix="/runner/v1")

    @r.post("/lease")
    def lease(runner: Runner) -> Response:
        got = store.lease(runner, ttl, max_per_repo=per_repo)
        if got is None:
            metrics.runner_calls.labels("lease", "empty").inc()
            return Response(status_code=204)
        metrics.runner_calls.labels("lease", "ok").inc()
        unit = store.unit(got.job.id)
        ctx.wake.set()  # the check run shows the job running
        body = {
            "job": got.job.model_dump(mode="json"),
            "unit": {"job_id": unit.job_id, "index": unit.index, "target": unit.target, "attempts": unit.attempts,
                     "retry_note": unit.retry_note} if unit else None,
            "lease_token": got.token,
            "lease_expires_at": got.expires_at.isoformat(),
            "lease_ttl_seconds": ttl,
        }
        return JSONResponse(body)

    @r.post("/jobs/{job_id}/heartbeat")
    def heartbeat(job_id: str, progress: Progress, runner: Runner, lease_token: LeaseToken) -> dict:
        try:
            state = store.heartbeat(job_id, lease_token, progress, ttl)
        except LeaseError:
            metrics.runner_calls.labels("heartbeat", "lost").inc()
            log.warning("runner %s: heartbeat for unit %s refused: its lease expired or the unit went to another "
                        "worker; that runner stops it", runner, job_id)
            raise HTTPException(409, "lease lost: stop working on this job") from None
        ctx.wake.set()  # the check run shows progress
        return {"state": state}

    @r.get("/jobs/{job_id}/source")
    def source(job_id: str, runner: Runner, lease_token: LeaseToken) -> FileResponse:
        try:
            job = store.check_lease(job_id, lease_token)
        except LeaseError:
            metrics.runner_calls.labels("source", "denied").inc()
            log.warning("runner %s asked for unit %s's source without its lease", runner, job_id)
            raise HTTPException(403, "this lease does not hold that job") from None
        if job.source_path is None or not Path(job.source_path).is_file():
            raise HTTPException(410, "the job's source is gone")
        return FileResponse(job.source_path, media_type="application/gzip", filename=f"{job_id}.tar.gz")

    @r.post("/jobs/{job_id}/result")
    def result(job_id: str, body: JobResult, runner: Runner, lease_token: LeaseToken) -> dict:
        if body.job_id != job_id:
            raise HTTPException(422, "result.job_id does not match the URL")
        try:
            recorded = store.complete(job_id, lease_token, body)
        except LeaseError:
            metrics.runner_calls.labels("result", "lost").inc()
            raise HTTPException(409, "lease lost: the result was not recorded") from None
        metrics.runner_calls.labels("result", "ok" if recorded else "repeat").inc()
        ctx.wake.set()
        return {"recorded": recorded}

    @r.post("/jobs/{job_id}/fail")
    def fail(job_id: str, body: FailIn, runner: Runner, lease_token: LeaseToken) -> dict:
        try:
            recorded = store.fail(job_id, lease_token, body.error)
        except LeaseError:
            raise HTTPException(409, "lease lost") from None
        ctx.wake.set()
        return {"recorded": recorded}

    @r.post("/jobs/{job_id}/release")
    def release(job_id: str, runner: Runner, lease_token: LeaseToken) -> dict:
        released = store.release(job_id, lease_token)
        log.info("runner %s released unit %s: %s", runner, job_id, released)
        ctx.wake.set()
        return {"released": released}

    return r
