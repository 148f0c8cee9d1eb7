"""Every job kind but a search has its publisher (bot/publish/kinds.py), and its runner entry (runner/results/
remeasure.py, held to the same JobKind by tests/runner/results/test_remeasure.py): a kind is never half added."""

from __future__ import annotations

from typing import get_args

from bot.publish.kinds import KERNEL_JOBS
from runner.contract import JobKind


def test_every_kind_that_searches_nothing_has_a_publisher():
    assert set(KERNEL_JOBS) == set(get_args(JobKind)) - {"search"}
    assert [k.verb for k in KERNEL_JOBS.values()] == ["Re-measure", "Re-verify"]
