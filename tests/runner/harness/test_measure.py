"""The time that counts (runner.harness.clocked): what the candidate's process reports is bounded by the parent's own
clock around back-to-back calls, less their steps timed in the judge (on CUDA less the reference's host work per call,
as the judge measured it). The decision, on injected measurements."""

from types import SimpleNamespace

import pytest

from runner.harness.clocked import (
    ESCAPE_MEASUREMENTS,
    MAX_CALLS,
    MIN_CALLS,
    Batches,
    batch_calls,
    bounded,
    common,
    decide,
    measured_decision,
    parent_bound_ms,
)
from runner.harness.timing import summarize


def timed(ms: float, host_ms: float | None = None):
    return summarize([ms * f for f in (0.9, 1.0, 1.0, 1.1)], clock="monotonic", l2_flushed=True, host_ms=host_ms)


def batches(call_ms: float, step_ms: float = 0.0, cpu_call_ms: float | None = None, calls: int = 100,
            cores: int = 1, overhead_ms: float = 0.0) -> Batches:
    """What the parent measured: `calls` calls of `call_ms` each with their steps, the steps alone, and (CUDA) the
    reference's host work per call in the judge."""
    cpu = call_ms if cpu_call_ms is None else cpu_call_ms
    return Batches(calls=calls, full_wall_ms=calls * (call_ms + step_ms), full_cpu_ms=calls * (cpu + step_ms),
                   steps_wall_ms=calls * step_ms, steps_cpu_ms=calls * step_ms, cores=cores, overhead_ms=overhead_ms)


@pytest.mark.parametrize("cuda", [False, True])
def test_a_reported_time_scaled_down_is_raised_to_what_the_parents_clock_allows(cuda):
    """A process that scales every time it reports by 0.11 (17 ms calls reported at 1.9 ms) is not believed: under
    the ratio that names an escape it is rejected, above it the time is raised to the parent's bound (on CUDA less
    the reference's host work per call, 0.5 ms, as the judge measured it)."""
    t, reasons = decide(timed(17.0 * 0.11), batches(17.0, step_ms=0.5, overhead_ms=0.5), cuda)
    if cuda:
        assert t is None and reasons[0].startswith("timer-escape")
    else:
        assert reasons == [] and t.median_ms == pytest.approx(17.0) and t.parent_ms == pytest.approx(17.0)
        assert t.min_ms == pytest.approx(17.0 * 0.9) and len(t.samples_ms) == 4
    t, reasons = decide(timed(17.0 * 0.6), batches(17.0, step_ms=0.5, overhead_ms=0.5), cuda)
    assert reasons == [] and t.median_ms == pytest.approx(17.0 - (0.5 if cuda else 0.0))


@pytest.mark.parametrize("forged_host_ms", [None, 0.0, 17.0, 1e9])
def test_a_forged_host_time_moves_neither_the_bound_nor_the_escape_line(forged_host_ms):
    """On CUDA a CUDA-event time scaled by 0.11, whatever host time its process claims beside it (none, none at all,
    its whole call, absurd): an escape on a kernel whose back-to-back calls take half a millisecond, and on one
    where the parent's clock allows 0.25 ms at least (above the line below which a host-bound call's GPU time is
    raised, not rejected) likewise; the allowance is the judge's measured 40 us of the reference's host work."""
    for call_ms in (0.55, 0.3):
        measured = batches(call_ms, step_ms=2.5, calls=39, overhead_ms=0.04)
        t, reasons = decide(timed(call_ms * 0.11, host_ms=forged_host_ms), measured, cuda=True)
        assert t is None and reasons[0].startswith("timer-escape"), (call_ms, reasons)
        assert "host work: " not in reasons[0]
    # scaled by 0.6 it is not an escape, and its time is the parent's bound, not its own
    t, reasons = decide(timed(0.55 * 0.6, host_ms=forged_host_ms), batches(0.55, step_ms=2.5, calls=39,
                                                                           overhead_ms=0.04), cuda=True)
    assert reasons == [] and t.median_ms == t.parent_ms == pytest.approx(0.55 - 0.04)
    assert t.host_ms == forged_host_ms  # (shown beside the time, as its process said: it decided nothing)


@pytest.mark.parametrize("cuda", [False, True])
def test_an_honest_time_above_the_bound_stands(cuda):
    t0 = timed(2.0)
    t, reasons = decide(t0, batches(1.6, step_ms=1.5, overhead_ms=0.03), cuda)  # warm calls beat the flushed timer
    assert reasons == [] and t.median_ms == 2.0 and t.samples_ms == t0.samples_ms and t.parent_ms == pytest.approx(
        1.6 - (0.03 if cuda else 0.0))  # (CUDA: the reference's host work the judge measured, 30 us a call)


def test_on_the_cpu_preemption_is_not_charged():
    """A loaded host preempts the child: wall time 3x the call, CPU time the call's own: the lesser bounds."""
    t, reasons = decide(timed(1.0), batches(3.0, cpu_call_ms=1.0), cuda=False)
    assert reasons == [] and t.median_ms == 1.0


def test_the_cpu_bound_is_the_total_cpu_time_not_divided_by_cores():
    """A single-threaded call of 4 ms on a 4-core child cannot be reported at 1 ms."""
    b = batches(4.0, cores=4)
    assert parent_bound_ms(b, cuda=False) == pytest.approx(4.0)
    t, reasons = decide(timed(1.0), b, cuda=False)
    assert reasons == [] and t.median_ms == pytest.approx(4.0)


def test_a_host_bound_cuda_call_keeps_its_gpu_time_within_the_measured_allowance():
    """7 us of GPU work behind 12 us of host work: back to back it runs at the host's pace. Its GPU time may be under
    that by the reference's host work (4 us a call, measured by the judge), by no more than half (6 us where the
    judge measured 40 us), and by nothing its own process claims: 17 us of host work claimed moves nothing."""
    t, reasons = decide(timed(0.007), batches(0.012, step_ms=0.040, overhead_ms=0.004), cuda=True)
    assert reasons == [] and t.median_ms == pytest.approx(0.008) and t.parent_ms == pytest.approx(0.008)
    t, reasons = decide(timed(0.007, host_ms=0.017), batches(0.012, step_ms=0.040, overhead_ms=0.040), cuda=True)
    assert reasons == [] and t.median_ms == pytest.approx(0.007) and t.parent_ms == pytest.approx(0.006)
    t, reasons = decide(timed(0.007, host_ms=0.017), batches(0.012, step_ms=0.040), cuda=True)
    assert reasons == [] and t.median_ms == pytest.approx(0.012)  # no allowance measured: the parent's clock


def test_on_cuda_the_allowance_is_never_more_than_half():
    """A reference whose host work per call (2 ms: a chain of small ops) exceeds the candidate's whole call (2 ms back
    to back): the GPU time may be under the parent's clock by half of it, 1 ms, and under half of that is an escape."""
    t, reasons = decide(timed(1.1), batches(2.0, step_ms=2.0, overhead_ms=2.0), cuda=True)
    assert reasons == [] and t.median_ms == pytest.approx(1.1) and t.parent_ms == pytest.approx(1.0)
    assert decide(timed(0.45), batches(2.0, step_ms=2.0, overhead_ms=2.0), cuda=True)[1][0].startswith("timer-escape")


# Two confirmation rounds of the seed's fused CUDA kernel for ScaledBiasReLU (examples/mlp_epilogue.py) on an H200
# (driver 580.159.04, torch 2.11.0+cu130): each run's (wall ms, CPU ms) of the candidate's batches and of the judge's
# steps, the judge's eager host work 0.1823 ms a call; the kernel's own time 0.009216 ms.
H200_ROUNDS = [
    (142, [(143.39, 135.98), (110.88, 103.99), (153.47, 143.82)], [(79.22, 72.69), (89.12, 81.97), (134.89, 126.99)],
     0.0),
    (95, [(97.31, 89.52), (110.56, 101.22), (101.78, 92.43)], [(93.34, 182.60), (84.89, 163.83), (88.07, 169.22)],
     0.0209),
]


@pytest.mark.parametrize(("calls", "full", "steps", "bound_ms"), H200_ROUNDS)
def test_an_escape_is_not_named_within_the_judges_noise(calls, full, steps, bound_ms):
    """A 9 us kernel behind fingerprints of a fraction of a millisecond a call: its batches and the judge's steps differ
    by the host's noise (the second round's least batch exceeds the judge's most steps by 42 us a call, within the
    steps' own spread of 89 us a call). Not an escape, whatever the ratio; the time is raised to the bound itself (the
    second round's 0.021 ms), and a confirmation's rounds to the median of theirs (`common`). Once, with the escape
    line drawn on the bound alone, such a round's 0.37 ms a call named an honest kernel an escape."""
    b = Batches.from_runs(calls, full, steps, overhead_ms=0.1823)
    assert parent_bound_ms(b, cuda=True, less_noise=True) == 0.0
    assert parent_bound_ms(b, cuda=True) == pytest.approx(bound_ms, abs=1e-4)
    t, reasons = decide(timed(0.009216), b, cuda=True)
    assert reasons == [] and t.median_ms == pytest.approx(max(0.009216, bound_ms), abs=1e-4)
    far = Batches.from_runs(calls, [(f + calls * 1.0, c) for f, c in full], steps, overhead_ms=0.1823)
    assert decide(timed(0.009216), far, cuda=True)[1][0].startswith("timer-escape")  # 1 ms a call more: named


@pytest.mark.parametrize("cuda", [False, True])
def test_the_judges_noise_does_not_hide_a_forged_time(cuda):
    """17 ms calls reported at 0.11 of their time, the judge's steps spreading 40% between runs (0.3-0.5 ms a call):
    the bound is still about 17 ms, and the forged time is rejected (CUDA) or raised to it (CPU)."""
    calls = 20
    full = [(calls * 17.5, calls * 17.5)] * 3
    steps = [(calls * 0.3, calls * 0.3), (calls * 0.5, calls * 0.5), (calls * 0.4, calls * 0.4)]
    b = Batches.from_runs(calls, full, steps, overhead_ms=0.05)
    assert parent_bound_ms(b, cuda, less_noise=True) == pytest.approx(17.5 - 0.5 - 0.2 - (0.05 if cuda else 0.0))
    t, reasons = decide(timed(17.0 * 0.11), b, cuda)
    if cuda:
        assert t is None and reasons[0].startswith("timer-escape") and "noise of the judge's steps" in reasons[0]
    else:
        assert reasons == [] and t.median_ms == pytest.approx(17.0)  # raised to the bound itself


def test_a_timer_far_under_the_calls_cost_is_an_escape():
    assert decide(timed(0.1), batches(2.0), cuda=False)[1][0].startswith("timer-escape")
    assert decide(timed(0.5), batches(2.0, overhead_ms=0.1), cuda=True)[1][0].startswith("timer-escape")
    ok, reasons = decide(timed(2.0), batches(2.1), cuda=False)
    assert reasons == [] and ok.median_ms == pytest.approx(2.1)


def test_a_batch_is_sized_by_the_parents_cost_not_by_the_reported_time():
    """A 2K-element kernel of 5 us whose steps (fresh inputs, fingerprints) cost the parent 0.2 ms a call: a 100 ms
    budget holds 487 calls, not the 20,000 that 100 ms over 5 us would make; a process that reports a tiny time
    gets no more than the cap, one that reports a huge one at least MIN_CALLS."""
    assert batch_calls(100.0, 0.2, 0.005, cuda=False) == 487
    assert batch_calls(100.0, 0.2, 0.005, cuda=False) * (0.2 + 0.005) <= 100.0
    assert batch_calls(400.0, 0.001, 0.0, cuda=False) == MAX_CALLS["cpu"]
    assert batch_calls(100.0, 0.0, 0.0, cuda=True) == MAX_CALLS["cuda"]
    assert batch_calls(100.0, 0.2, 1e6, cuda=False) == MIN_CALLS


def test_bounded_keeps_what_the_timing_says_about_the_call():
    t = timed(1.0).model_copy(update={"call": "drop-in", "lead_ms": 0.3})
    raised = bounded(t, 3.0)
    assert (raised.call, raised.lead_ms, raised.median_ms, raised.parent_ms) == ("drop-in", 0.3, 3.0, 3.0)


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_first_time_under_the_floor_not_held_in_a_fresh_process(monkeypatch, device):
    """On a GPU the floor is the memory system's and such a time is rejected; on a CPU the floor is a copy rate
    measured on a shared host (27-83 GB/s on one 2-core EPYC), and the fresh process's slower time is reported."""
    from runner.contract import Baselines, Roofline, Verdict
    from runner.harness import measure as m

    def flat(ms):
        return summarize([ms] * 10, clock="monotonic", l2_flushed=True)

    floor = Roofline(bytes_moved=1 << 20, bandwidth_bytes_per_s=1e9, bandwidth_source="test", floor_ms=1.0)
    ref = SimpleNamespace(device=device, tolerance_notes=set(), digests=[], roofline=lambda: floor,
                          baselines=lambda: Baselines(eager=flat(4.0), compile=None))
    monkeypatch.setattr(m, "measure", lambda *a: (flat(0.5), []))
    v = Verdict(candidate_id="c", problem="p", accepted=True)
    m.time_candidate(None, None, ref, v, lambda: (flat(2.0), []))
    if device == "cpu":
        assert not v.reasons and v.timing.median_ms == 2.0 and v.speedup_vs_eager == 2.0
        assert any(w.startswith("below-floor") and "did not hold in a fresh process" in w for w in v.warnings)
    else:
        assert v.reasons and v.reasons[0].startswith("below-floor") and v.timing is None


def test_the_cuda_allowance_is_the_judges_measure_of_the_reference_never_the_candidates():
    """overhead_ms reads the eager baseline's host time, taken by the judge's timer; with none, nothing is allowed."""
    from runner.contract import Baselines
    from runner.harness.measure import overhead_ms

    eager = timed(0.5, host_ms=0.04)
    assert overhead_ms(SimpleNamespace(baselines=lambda: Baselines(eager=eager, compile=None))) == 0.04
    assert overhead_ms(SimpleNamespace(baselines=lambda: Baselines(eager=timed(0.5), compile=None))) == 0.0


def test_a_confirmations_rounds_are_raised_to_the_median_of_their_bounds():
    """The bounds of an honest 9 us CUDA kernel's five rounds on an H200 (0, 0, 0, 0, 0.031 ms): each round raised to
    its own made the rounds spread 234%; raised together to the median, they keep the timer's spread. A forged time
    whose every round the parent bounds at 17 ms is raised to it however one round's noise fell, and
    `decide(raise_=False)` records the bound without applying it (an escape is still an escape)."""
    rounds = [decide(timed(0.0092), batches(0.0092), cuda=True, raise_=False)[0] for _ in range(5)]
    rounds = [r.model_copy(update={"parent_ms": b}) for r, b in zip(rounds, (0.0, 0.0, 0.0, 0.0, 0.031), strict=True)]
    assert [r.median_ms for r in common(rounds)] == pytest.approx([0.0092] * 5)
    forged = [timed(1.9).model_copy(update={"parent_ms": b}) for b in (17.0, 16.8, 17.2, 3.0, 17.1)]
    assert [r.median_ms for r in common(forged)] == pytest.approx([17.0] * 5)
    t, reasons = decide(timed(1.9), batches(17.0), cuda=False, raise_=False)
    assert reasons == [] and t.median_ms == pytest.approx(1.9) and t.parent_ms == pytest.approx(17.0)
    assert decide(timed(0.5), batches(2.0, overhead_ms=0.1), cuda=True, raise_=False)[1][0].startswith("timer-escape")


def test_an_escape_is_named_only_where_every_measurement_names_it():
    """A stall of the host spread over a few calls reads as an escape in one measurement (an honest 0.5 ms kernel,
    3 calls of which took 13 ms each by both clocks on a loaded CI host); measured again it is not, and the second
    measurement's bound is the one recorded. A kernel whose work escapes is named in each, and rejected."""
    stalled, clear = batches(13.27, step_ms=130.0, calls=3), batches(0.6, step_ms=0.5, calls=400)
    seen = iter([stalled, clear])
    t, reasons = measured_decision(timed(0.5), lambda: next(seen), cuda=False)
    assert reasons == [] and t.parent_ms == pytest.approx(0.6) and t.median_ms == pytest.approx(0.6)
    calls = []
    t, reasons = measured_decision(timed(0.5), lambda: calls.append(1) or stalled, cuda=False)
    assert t is None and len(calls) == ESCAPE_MEASUREMENTS >= 2
    assert reasons[0].startswith("timer-escape") and f"in each of {ESCAPE_MEASUREMENTS} measurements" in reasons[0]


def test_a_reason_that_is_not_noise_is_returned_without_measuring_again():
    calls = []
    wrong = ["timer-escape: output 0 of back-to-back call 2, timed by the parent's clock, is not the oracle's"]
    t, reasons = measured_decision(timed(0.5), lambda: calls.append(1) or wrong, cuda=True)
    assert t is None and reasons == wrong and calls == [1]
