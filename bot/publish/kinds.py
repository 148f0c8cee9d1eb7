"""What the bot does with each kind of job (runner.contract.JobKind) that searches nothing: how its check run names
the work, the check run's final text, and where its result goes. A search's result goes to PRs (bot/publish/deliver.py).
A new kind is one entry here (its publisher beside it) and one in the runner's KERNEL_JOBS
(runner/results/remeasure.py); tests/bot/publish/test_kinds.py holds both tables to JobKind.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from bot.github.platform import CheckOutput, Platform
from bot.publish.benchmark import benchmark_check, deliver_benchmark
from bot.publish.hygiene import deliver_hygiene, hygiene_check
from bot.publish.propose import Published
from runner.contract import Job, JobResult


@dataclass(frozen=True)
class KernelJobKind:
    verb: str  # the work as its check run names it: "Re-measure 3 kernel(s)"
    check: Callable[[Job, JobResult], CheckOutput]  # the check run's text when the job is done
    deliver: Callable[[Platform, Job, JobResult, int | None], list[Published]]  # (platform, job, result, check run)


def _deliver_benchmark(platform: Platform, job: Job, result: JobResult, check_run_id: int | None) -> list[Published]:
    """A comment on the PR the command came from, and the job's check run: no PR."""
    deliver_benchmark(platform, job, result, check_run_id=check_run_id)
    return []


def _deliver_hygiene(platform: Platform, job: Job, result: JobResult, check_run_id: int | None) -> list[Published]:
    """The removal PR against the job's branch (the default branch unless the job names one), when a kernel is stale."""
    published = deliver_hygiene(platform, job, result, base=job.ref or platform.default_branch(),
                                check_run_id=check_run_id)
    return [published] if published else []


KERNEL_JOBS: dict[str, KernelJobKind] = {
    "benchmark": KernelJobKind("Re-measure", benchmark_check, _deliver_benchmark),
    "hygiene": KernelJobKind("Re-verify", lambda job, result: hygiene_check(result.targets), _deliver_hygiene),
}
