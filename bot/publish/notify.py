"""Job state -> check run on the job's commit. An outbox: the background loop calls `sync_check_runs` until every
job's check run shows its state, so a restart or an unreachable GitHub delays updates but never loses one.

`check_run_view` is pure; issue 6's PR composer will replace its summary with the full results table.
"""

from __future__ import annotations

import logging

from bot.context import Context
from bot.github import client
from bot.publish.benchmark import benchmark_check
from bot.publish.deliver import deliver_job
from bot.publish.hygiene import hygiene_check
from bot.store.jobs import JobInfo

log = logging.getLogger(__name__)


def check_run_name(base: str, kind: str) -> str:
    """`fusebot` for a search; `fusebot benchmark` and `fusebot hygiene` for the others, so they never hide it."""
    return base if kind == "search" else f"{base} {kind}"


def check_run_view(job: JobInfo) -> tuple[str, str | None, str, str]:
    """(status, conclusion, title, summary) for a job."""
    if job.state == "cancelled":
        return "completed", "cancelled", "Cancelled", "The job was cancelled."
    if job.state == "failed":
        return "completed", "failure", "fusebot failed", f"The job failed: {job.error or 'no detail'}"
    if job.spec.kind != "search":
        return _kernel_job_view(job)
    n = len(job.spec.targets)
    targets = "\n".join(f"- `{t.name}` ({t.file})" for t in job.spec.targets[:50])
    if job.state == "queued":
        return "queued", None, f"Queued: {n} target(s)", f"Waiting for a GPU runner.\n\n{targets}"
    if job.state in ("leased", "running"):
        p = job.progress
        detail = f"round {p.round}, {p.built} built, {p.verified} verified" if p else "starting"
        return "in_progress", None, f"Searching: {detail}", targets
    improved = [t for t in (job.result.targets if job.result else []) if t.improved]
    if not improved:
        return "completed", "neutral", "No faster kernel found", "Nothing beat the faster baseline."
    lines = "\n".join(f"- `{t.target}`: {t.message}" for t in improved)
    return "completed", "success", f"Faster kernels for {len(improved)} of {n} target(s)", lines


def _kernel_job_view(job: JobInfo) -> tuple[str, str | None, str, str]:
    """Benchmark and hygiene jobs: fusebot's kernels in the commit, re-verified and re-timed (no search)."""
    spec = job.spec
    kernels = "\n".join(f"- `{spec.kernels_dir}/{k}`" for k in spec.kernels[:50])
    what = "Re-measure" if spec.kind == "benchmark" else "Re-verify"
    if job.state == "queued":
        return "queued", None, f"Queued: {what.lower()} {len(spec.kernels)} kernel(s)", \
            f"Waiting for a GPU runner.\n\n{kernels}"
    if job.state in ("leased", "running"):
        p = job.progress
        title = p.message[:1].upper() + p.message[1:] if p and p.message else f"{what}: starting"
        return "in_progress", None, title[:255], kernels
    if job.result is None:
        return "completed", "neutral", "No result", "The job finished without a result."
    out = benchmark_check(spec, job.result) if spec.kind == "benchmark" else hygiene_check(job.result.targets)
    return out.status, out.conclusion, out.title, out.summary


STOP = {"label": "Stop", "description": "Cancel this fusebot job", "identifier": "stop"}
RERUN = {"label": "Run again", "description": "Run this fusebot job again", "identifier": "rerun"}


def check_run_actions(status: str) -> list[dict[str, str]]:
    """The buttons on the check run (they arrive as check_run.requested_action)."""
    return [STOP] if status != "completed" else [RERUN]


def sync_check_runs(ctx: Context, limit: int = 20) -> int:
    """Bring check runs up to date with job states. Returns how many were written."""
    done = 0
    for job in ctx.store.unnotified(limit):
        if job.installation_id is None:
            ctx.store.mark_notified(job.id, job.state, None)
            continue
        status, conclusion, title, summary = check_run_view(job)
        gh = ctx.gh(job.installation_id)
        if job.check_run_id is None:
            run_id = client.create_check_run(
                gh, job.repo, name=check_run_name(ctx.settings.check_run_name, job.spec.kind), head_sha=job.sha,
                status=status,
                conclusion=conclusion, title=title, summary=summary, external_id=job.id,
                actions=check_run_actions(status),
            )
        else:
            run_id = job.check_run_id
            client.update_check_run(
                gh, job.repo, run_id, status=status, conclusion=conclusion, title=title, summary=summary,
                actions=check_run_actions(status),
            )
        if job.state == "succeeded" and job.result is not None:  # PRs, full tables, status comment (bot/publish/deliver.py)
            deliver_job(ctx, job, run_id)
        ctx.store.mark_notified(job.id, job.state, run_id)
        done += 1
    return done
