"""Nightly hygiene, the bot's half: a PR that removes the merged fusebot kernels that no longer earn their place.

The runner re-verifies and re-times each merged kernel (runner/results/remeasure.py) and returns one TargetResult per kernel:
`improved` true when it still holds; otherwise `message` says why (no longer correct, or no longer faster than the
faster of eager and torch.compile on today's torch and device) and `files` holds the removal (REMOVED_FILE marks a
deleted file; the drop-in becomes a shim re-exporting the original class, so imports keep working). The PR lives on
`fusebot/<base>/hygiene`, found again by its marker and updated in place; with nothing stale, nothing is opened.
`deliver_hygiene` is the App's entry point for a nightly hygiene job (bot/publish/deliver.py): the PR, then the check run.
"""

from __future__ import annotations

import logging

from bot.github.platform import CheckOutput, Platform, marker
from bot.publish.plan import branch_name, pr_key
from bot.publish.propose import Published
from bot.publish.text import clip
from bot.publish.verdicts import environment_line, speedup, target_table
from runner.contract import REMOVED_FILE, Environment, Job, JobResult, TargetResult

log = logging.getLogger(__name__)

GROUP = "hygiene"


def removal_files(results: list[TargetResult], kernels_dir: str) -> dict[str, str | None]:
    return {f"{kernels_dir}/{path}": (None if text == REMOVED_FILE else text)
            for r in results if not r.improved for path, text in sorted(r.files.items())}


def _kept_line(r: TargetResult) -> str:
    s = speedup(r.verdict)
    if s is not None:
        return f"- `{r.class_name or r.target}`: {s:.2f}x over the faster baseline"
    return f"- `{r.class_name or r.target}`" + (f": {r.message}" if r.verdict is None and r.message else "")


def hygiene_body(results: list[TargetResult], *, base: str, commit: str, environment: Environment | None,
                 kernels_dir: str, job_id: str | None = None) -> str:
    stale = [r for r in results if not r.improved]
    kept = [r for r in results if r.improved]
    lines = [marker("pr", pr_key(base, GROUP)) + (marker("job", job_id) if job_id else ""),
             f"**fusebot re-verified {len(results)} merged kernel(s) at `{commit[:12]}`: {len(stale)} no longer earn "
             "their place** and are removed here.", "", environment_line(environment), ""]
    for r in stale:
        lines += [target_table(r.model_copy(update={"message": "", "improved": True})), "",
                  f"**Removed**: {r.message}", ""]
    if kept:
        lines += ["Still correct and faster (kept):", ""]
        lines += [_kept_line(r) for r in kept]
        lines.append("")
    removed = sorted(p for p, t in removal_files(results, kernels_dir).items() if t is None)
    shims = sorted(p for p, t in removal_files(results, kernels_dir).items() if t is not None)
    lines += ["### What changes", "", *[f"- removed `{p}`" for p in removed],
              *[f"- `{p}` now re-exports the original class, so code importing it keeps working" for p in shims], "",
              "Revert this PR to keep a kernel; `/fusebot benchmark` on it re-measures first."]
    return clip("\n".join(lines))


def publish_hygiene(platform: Platform, results: list[TargetResult], *, base: str, base_sha: str,
                    environment: Environment | None = None, kernels_dir: str = "fusebot_kernels",
                    job_id: str | None = None) -> Published | None:
    """Open or update the hygiene PR; None (and nothing opened) when every merged kernel still holds."""
    stale = [r for r in results if not r.improved]
    if not stale:
        log.info("hygiene: all %d merged kernel(s) still hold", len(results))
        return None
    branch = branch_name(base, GROUP)
    files = removal_files(results, kernels_dir)
    names = ", ".join(r.class_name or r.target for r in stale)
    update = platform.commit_files(branch, base_sha, files, f"fusebot: remove stale kernels ({names})\n")
    body = hygiene_body(results, base=base, commit=base_sha, environment=environment, kernels_dir=kernels_dir,
                        job_id=job_id)
    ref = platform.upsert_pull_request(branch=branch, base=base, title=f"fusebot: remove stale kernels ({names})"[:250],
                                       body=body, key=pr_key(base, GROUP))
    return Published(ref, update, body, "success")


def hygiene_check(results: list[TargetResult], pr_url: str | None = None) -> CheckOutput:
    """The hygiene job's check run: `success` when every merged kernel holds, `neutral` with the removal PR when not."""
    stale = [r for r in results if not r.improved]
    lines = [f"- `{r.class_name or r.target}`: {'holds' if r.improved else 'stale'}: {r.message}" for r in results]
    if not stale:
        return CheckOutput("completed", f"All {len(results)} merged kernel(s) still hold",
                           clip("\n".join(["Re-verified and re-timed; each is still correct and faster than the "
                                           "faster of PyTorch eager and torch.compile.", "", *lines])), "success")
    link = f"Their removal is proposed in {pr_url}." if pr_url else "Their removal is proposed in a pull request."
    tables = "\n\n".join(target_table(r.model_copy(update={"improved": True, "message": ""})) for r in stale)
    summary = "\n\n".join([link, "\n".join(lines), tables])
    return CheckOutput("completed", f"{len(stale)} of {len(results)} merged kernel(s) no longer hold",
                       clip(summary), "neutral")


def deliver_hygiene(platform: Platform, job: Job, result: JobResult, *, base: str,
                    check_run_id: int | None = None) -> Published | None:
    """A finished hygiene job: the removal PR (none when every kernel holds), then its check run."""
    published = publish_hygiene(platform, result.targets, base=base, base_sha=job.sha,
                                environment=result.environment, kernels_dir=job.kernels_dir, job_id=job.id)
    if check_run_id is not None:
        url = published.pull_request.url if published and published.pull_request else None
        platform.update_check_run(check_run_id, hygiene_check(result.targets, url))
    return published
