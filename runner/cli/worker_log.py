"""What `fusebot worker` writes to its log: one line per unit leased, one per target with its verdict, and polling
quiet unless -v."""

from __future__ import annotations

import logging

from runner.contract import JobResult


def result_lines(job_id: str, result: JobResult) -> list[str]:
    """One line per target of a finished unit: what a person reading the worker's log wants to know."""
    lines = []
    for t in result.targets:
        verdict = "faster kernel" if t.improved else "no faster kernel"
        lines.append(f"job {job_id} target {t.target}: {verdict}" + (f": {t.message}" if t.message else ""))
    return lines or [f"job {job_id}: done"]


def quiet_polling(verbose: bool) -> None:
    """httpx logs every request at INFO, a line per poll: only with -v."""
    logging.getLogger("httpx").setLevel(logging.INFO if verbose else logging.WARNING)
