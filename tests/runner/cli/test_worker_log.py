"""The worker's log: a line per target with its verdict; the bot's polling only with -v."""

from __future__ import annotations

import logging

from runner.cli.worker_log import quiet_polling, result_lines
from runner.contract import JobResult, TargetResult


def test_a_finished_unit_logs_each_target_s_verdict():
    result = JobResult(job_id="j", ok=True, targets=[
        TargetResult(target="Norm", improved=True, message="0.21 ms, 1.42x over torch.compile"),
        TargetResult(target="Gelu", improved=False, message="nothing beat torch.compile (0.51 ms)")])
    assert result_lines("j", result) == ["job j target Norm: faster kernel: 0.21 ms, 1.42x over torch.compile",
                                         "job j target Gelu: no faster kernel: nothing beat torch.compile (0.51 ms)"]
    assert result_lines("k", JobResult(job_id="k", ok=True)) == ["job k: done"]


def test_polling_is_quiet_unless_verbose():
    httpx_log = logging.getLogger("httpx")
    saved = httpx_log.level
    try:
        quiet_polling(False)
        assert not httpx_log.isEnabledFor(logging.INFO)
        quiet_polling(True)
        assert httpx_log.isEnabledFor(logging.INFO)
    finally:
        httpx_log.setLevel(saved)
