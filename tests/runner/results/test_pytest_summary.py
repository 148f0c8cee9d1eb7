"""pytest's summary line, read as the runner's check of a generated test reads it."""

from __future__ import annotations

from runner.results.pytest_summary import pytest_summary


def test_the_generated_tests_counts_come_from_pytests_own_summary_line():
    """A plugin's warning after the summary (pytest-benchmark's under xdist, seen on a GPU machine) is not the
    summary: the counts still come from pytest's line."""
    stdout = ".s                                                   [100%]\n1 passed, 1 skipped in 0.52s\n" \
             "  warner(PytestBenchmarkWarning(text))\n"
    assert pytest_summary(stdout) == ("1 passed, 1 skipped in 0.52s",
                                      {"passed": 1, "failed": 0, "skipped": 1, "error": 0})
    assert pytest_summary("=== 2 failed, 3 passed, 1 error in 1.0s ===\n")[1] == \
        {"passed": 3, "failed": 2, "skipped": 0, "error": 1}
    summary, counts = pytest_summary("no tests ran in 0.01s\n")
    assert summary == "no tests ran in 0.01s" and counts["passed"] == 0
    assert pytest_summary("") == ("", {"passed": 0, "failed": 0, "skipped": 0, "error": 0})
