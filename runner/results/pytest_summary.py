"""pytest's own summary of a run, read from what it printed: the counts the runner's check of a generated test
(runner.results.files.check_dropin) decides on."""

from __future__ import annotations

import re

_COUNTS = re.compile(r"(\d+) (passed|failed|skipped|error|errors)\b")


def text_of(data: str | bytes | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else (data or "")


def pytest_summary(stdout: str) -> tuple[str, dict[str, int]]:
    """pytest's own last summary line ("1 passed, 2 skipped in 0.52s") and its counts. Read from pytest's stdout, the
    last line that holds counts: a plugin's warning on stderr (pytest-benchmark's under xdist, say) or a line printed
    after the summary is not the summary."""
    counts = {"passed": 0, "failed": 0, "skipped": 0, "error": 0}
    lines = [line for line in stdout.strip().splitlines() if _COUNTS.search(line)]
    summary = lines[-1].strip("= ") if lines else (stdout.strip().splitlines() or [""])[-1]
    for n, word in _COUNTS.findall(summary if lines else ""):
        counts["error" if word.startswith("error") else word] += int(n)
    return summary, counts
