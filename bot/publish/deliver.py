"""A finished job's results to GitHub: PRs (one per group), the final check run, the labelled PR's status comment.

    deliver(platform, job, result, base=..., base_sha=..., check_run_id=..., label_pr=..., fork=...)

Grouping follows the repository config (`pr_grouping`): `per-target` opens one PR per improved target
(`fusebot/<base>/<target>`), `single` one PR for all (`fusebot/<base>/kernels`). A fork's PR gets one comment with the
patch. The check run and the status comment summarise every target, whichever PRs they went to.
`deliver_job` is the App's entry point (called by the check-run outbox when a job succeeded); it routes the result of
a job that searched nothing to its kind's publisher (bot/publish/kinds.py: a benchmark job's to a comment on its PR, a
hygiene job's to the removal PR). A PlatformError propagates: the outbox retries the job.
"""

from __future__ import annotations

import logging

from bot.github.platform import Platform
from bot.publish.checks import check_completed
from bot.publish.comments import status_comment
from bot.publish.kinds import KERNEL_JOBS
from bot.publish.plan import PullRequestPlan
from bot.publish.propose import Published, propose
from bot.repo.config import CONFIG_PATH, ConfigError, load_config
from bot.store.jobs import JobInfo
from runner.contract import Job, JobResult, TargetResult

log = logging.getLogger(__name__)

SINGLE_GROUP = "kernels"


def groups(results: list[TargetResult], grouping: str) -> list[tuple[str, list[TargetResult]]]:
    if grouping == "single":
        return [(SINGLE_GROUP, results)]
    return [(r.target, [r]) for r in results]


def deliver(platform: Platform, job: Job, result: JobResult, *, base: str, base_sha: str,
            check_run_id: int | None, label_pr: int | None, fork: bool, kernels_dir: str = "fusebot_kernels",
            grouping: str = "per-target") -> list[Published]:
    def plan(group: str, results: list[TargetResult]) -> PullRequestPlan:
        return PullRequestPlan(repo=job.repo, base=base, group=group, commit=base_sha, results=results,
                               environment=result.environment, kernels_dir=kernels_dir, source_pr=label_pr,
                               trigger=job.trigger, job_id=job.id)

    targets = [r if r.files or not r.improved else  # a kernel must come with its files to be proposed
               r.model_copy(update={"improved": False, "message": f"{r.message} (no files came back: not proposed)"})
               for r in result.targets]
    everything = plan(SINGLE_GROUP, targets)
    if fork or not everything.improved:  # one comment (fork) or nothing to open: publish handles both
        return [propose(platform, everything, base_sha=base_sha, check_run_id=check_run_id, label_pr=label_pr,
                        fork=fork and bool(everything.improved))]
    published = [propose(platform, plan(g, rs), base_sha=base_sha)
                 for g, rs in groups(targets, grouping) if any(r.improved for r in rs)]
    urls = ", ".join(p.pull_request.url for p in published if p.pull_request)
    if check_run_id is not None:
        platform.update_check_run(check_run_id, check_completed(everything, pr_url=urls))
    if label_pr is not None:
        platform.upsert_comment(label_pr, "status", f"pr-{label_pr}",
                                status_comment(label_pr, "done", everything, pr_url=urls))
    return published


def deliver_job(platform: Platform, job: JobInfo, check_run_id: int | None) -> list[Published]:
    """The App's side: base and fork from the labelled PR (or the default branch), config from the commit."""
    if job.result is None:
        return []
    if (kind := KERNEL_JOBS.get(job.spec.kind)) is not None:
        return kind.deliver(platform, job.spec, job.result, check_run_id)
    try:
        config = load_config(platform.read_file(job.sha, CONFIG_PATH))
    except ConfigError:  # reported on the config's own check run when the job was made; defaults here
        config = load_config(None)
    if job.pr_number is not None:
        pull = platform.pull(job.pr_number)
        base, fork = pull.head_ref, pull.is_fork
    else:
        base, fork = job.spec.ref or platform.default_branch(), False
    return deliver(platform, job.spec, job.result, base=base, base_sha=job.sha, check_run_id=check_run_id,
                   label_pr=job.pr_number, fork=fork, kernels_dir=config.kernels_dir, grouping=config.pr_grouping)
