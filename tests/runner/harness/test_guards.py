"""What a candidate may not leave behind, and what an honest one may: an idle thread pool (OpenMP's) is not
background work; a native thread still running after the call is."""

from runner.contract import Candidate

from ..adversarial import HONEST_OPENMP, NATIVE_BACKGROUND


def fast(cid: str, sources: dict[str, str]) -> Candidate:
    return Candidate(id=cid, format="fast", backend="cpu", sources=sources)


def test_an_idle_openmp_pool_is_not_background_work_and_a_busy_thread_is(cpu_evaluator):
    pool, busy = cpu_evaluator.evaluate_many([fast("openmp", HONEST_OPENMP), fast("spinner", NATIVE_BACKGROUND)])
    assert pool.accepted, pool.reasons
    assert not busy.accepted and any(r.startswith("background-thread") for r in busy.reasons), busy.reasons
