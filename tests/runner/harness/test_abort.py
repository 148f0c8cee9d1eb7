"""`Evaluator.abort()`: the evaluation in flight is cut off (its candidates' processes killed) when the search's budget
runs out or the job is cancelled, instead of running to the candidate's own time-outs."""

from __future__ import annotations

import threading

from runner.contract import Candidate
from runner.harness.config import HarnessConfig
from runner.harness.evaluator import Evaluator

from ..adversarial import HANG
from ..conftest import FAST_TIMER, scale_relu_spec


def test_an_aborted_evaluation_returns_at_once(harness_cache):
    # a kernel that never returns: without the abort it would hold the evaluation for the trial's time-out (an hour)
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache, trial_timeout_s=3600,
                        init_timeout_s=3600)
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        started = threading.Event()

        def abort_once_running() -> None:
            while not ev._live:  # the chunk's processes are started
                if started.wait(0.01):
                    return
            ev.abort()

        t = threading.Thread(target=abort_once_running, daemon=True)
        t.start()
        hang, = ev.evaluate_many([Candidate(id="hang", format="fast", backend="cpu", sources=HANG)])
        started.set()
        t.join(5)
        assert not hang.accepted and hang.reasons, hang
        assert any("cut off" in r or "killed" in r or "died" in r for r in hang.reasons), hang.reasons
