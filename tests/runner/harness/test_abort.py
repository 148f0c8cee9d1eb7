"""`Evaluator.abort()`: the evaluation in flight is cut off (its candidates' processes killed) when the search's budget
runs out or the job is cancelled, instead of running to the candidate's own time-outs."""

from __future__ import annotations

import threading

from runner.contract import Candidate
from runner.harness.config import HarnessConfig
from runner.harness.evaluator import Evaluator, Run

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


def test_an_abort_during_the_builds_starts_no_candidate_process(harness_cache, monkeypatch):
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        spawned: list[str] = []
        monkeypatch.setattr(ev.contestants, "spawn", lambda c, *a: spawned.append(c.id))

        def build_many(candidates, **kw):
            ev.abort()  # the budget runs out while the compiler works
            return {}

        monkeypatch.setattr("runner.harness.evaluator.builder.build_many", build_many)
        cut, = ev.evaluate_many([Candidate(id="late", format="fast", backend="cpu", sources=HANG)])
        assert spawned == [] and not cut.accepted and cut.reasons[0].startswith("cut off")
        monkeypatch.setattr("runner.harness.evaluator.builder.build_many", lambda candidates, **kw: {})
        monkeypatch.setattr(ev, "_begin", lambda c, b, tag: spawned.append(c.id) or Run(c, cut))
        ev.evaluate_many([Candidate(id="next", format="fast", backend="cpu", sources=HANG)])
        assert spawned == ["next"]  # the next evaluation is not aborted
