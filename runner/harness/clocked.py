"""What the parent's own clock allows a candidate's time to be: a pure decision on measured batches.

The candidate's process reports its own samples (CUDA events, the CPU timer), but that process is the candidate's:
it can rewrite how its requests are served and scale every time it reports. So the time that counts is bounded by
the parent's clock around a batch of back-to-back calls (runner.harness.procs.batch), less the same steps timed in
the judge, a process the candidate never touched:

- CPU: per call, the lesser of the parent's wall clock and the CPU time the kernel accounted to the candidate's
  processes (preemption on a loaded host is in the first, not the second), each less the judge's for the steps.
  The in-process median may not be under it: the in-process timer flushes the caches before every call, so an honest
  kernel's median is above its warm back-to-back time.
- CUDA: per call, the parent's wall clock less the judge's steps; the in-process GPU time may beat it by an overhead
  the parent measured itself, never one the candidate's process reports: the reference's own host work per call, as
  the judge's timer took it for the eager baseline (`Batches.overhead_ms`: back-to-back calls of a call bound by its
  host work run at its host's pace, which a GPU time leaves out), and never by more than half (CUDA_ALLOWANCE).
  The `host_ms` the candidate's process reports is shown beside its time and decides nothing.
- The escape line (below) is drawn on the bound less the noise of the judge's steps (the spread of its three batches,
  per call): where the steps cost more than the call (a kernel of microseconds behind fingerprints of a fraction of a
  millisecond), the difference of the two is the host's noise, and an escape named on noise rejects an honest kernel.
  The spread is the judge's, a process the candidate never touched (a process could widen its own). A time is still
  raised to the bound itself; a confirmation raises its rounds together, to the median of their bounds (`common`).

A batch is sized by what it costs the parent, not by the time the candidate's process reports: as many calls as the
batch's budget (`wall_check_ms` on CUDA, `cpu_check_ms` on the CPU) holds at the judge's measured cost of a call's
steps (fresh inputs, fingerprints, their reply) plus the reported time, at least MIN_CALLS, at most MAX_CALLS
(`batch_calls`). A process that reports less than it takes only makes its own batches longer, to the cap.

A median under that bound is raised to it (the samples scaled alike) and `Timing.parent_ms` records it. A timer that
sees under CPU_ESCAPE_RATIO (CPU) or half (CUDA) of the bound is `timer-escape`, rejected, once it has held in
ESCAPE_MEASUREMENTS measurements (`measured_decision`): an escape is the kernel's, and is in every batch it runs; a
stall of the host is in one measurement, and rejected an honest kernel when it was taken as an escape.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from runner.contract import Timing
from runner.harness.timing import summarize

log = logging.getLogger(__name__)

# On the CPU an escape is a timer seeing under a tenth of the calls' cost: on the 2-core development host under load
# (load average 11-14) honest multi-threaded kernels measured 2-4x their timed time by both the wall clock and CPU time
# (preemption, and thread pools spinning at their barriers while a sibling was preempted); escapes seen were 18-181x.
CPU_ESCAPE_RATIO = 0.1
# On CUDA the in-process GPU time may be under the parent's per-call time by the measured overhead, and by at most this
# fraction of it (a call of 7 us of GPU work behind 17 us of host work runs back to back at its host's pace); a timer
# under CUDA_ESCAPE_RATIO of the bound is an escape, where the bound is over CUDA_ESCAPE_LEAST_MS (below it a host-bound
# call's GPU time is legitimately a fraction of its back-to-back time: it is raised to the bound, not rejected).
CUDA_ALLOWANCE = 0.5
CUDA_ESCAPE_RATIO = 0.5
CUDA_ESCAPE_LEAST_MS = 0.2
CPU_ESCAPE_LEAST_MS = 0.02
# An escape is named once it holds in this many measurements, each sized and taken afresh. On a 2-core CI host under
# load an honest 16K-element loop (0.5 ms by its timer) was named twice in one run: a stall inflated the sizing probe
# to over 100 ms a call, the batches held 3 and 9 calls, and one stall of the candidate's process, spread over so few
# calls, read as 13 and 6 ms a call. A kernel's escape is in every batch: measuring again costs only the escapes.
ESCAPE_MEASUREMENTS = 3


# calls a batch holds: at least enough to draw one from, at most what the parent fingerprints and parses in well
# under a second on the 2-core development host (its steps cost 0.1-0.3 ms a call there under load)
MIN_CALLS = 3
MAX_CALLS = {"cpu": 2000, "cuda": 1000}
# the sizing probe's calls of the judge's steps: from 1, four times more while under PROBE_CALLS_MIN or under a quarter
# of the budget, to PROBE_CALLS_MAX
PROBE_CALLS_MIN = 16
PROBE_CALLS_MAX = 64


def batch_calls(budget_ms: float, step_ms: float, call_ms: float, cuda: bool) -> int:
    """The calls of one batch: what `budget_ms` of the parent's time holds at `step_ms` (the judge's steps, a call)
    plus `call_ms` (the reported time, a call)."""
    per_call = max(step_ms, 0.0) + max(call_ms, 0.0)
    most = MAX_CALLS["cuda" if cuda else "cpu"]
    return max(MIN_CALLS, min(most, int(budget_ms / per_call) if per_call > 0 else most))


@dataclass(frozen=True)
class Batches:
    """The parent's measurements, each the least of its runs: `calls` back-to-back calls in the candidate's process
    (wall ms by the parent's clock, CPU ms the kernel accounted to it), the same steps without the calls in the
    judge's, the cores the candidate may use, and (CUDA) the overhead per call a GPU time may leave out, measured on
    the parent's side: the reference's host work per call in the judge."""

    calls: int
    full_wall_ms: float
    full_cpu_ms: float
    steps_wall_ms: float
    steps_cpu_ms: float
    cores: int = 1
    overhead_ms: float = 0.0
    steps_spread_wall_ms: float = 0.0
    steps_spread_cpu_ms: float = 0.0

    @classmethod
    def from_runs(cls, calls: int, full: list[tuple[float, float]], steps: list[tuple[float, float]],
                  cores: int = 1, overhead_ms: float = 0.0) -> Batches:
        """From each run's (wall ms, CPU ms): the least of the candidate's batches, the most of the judge's steps,
        and the spread of the judge's steps (most less least)."""
        walls, cpus = [s[0] for s in steps], [s[1] for s in steps]
        return cls(calls=calls, full_wall_ms=min(f[0] for f in full), full_cpu_ms=min(f[1] for f in full),
                   steps_wall_ms=max(walls), steps_cpu_ms=max(cpus), cores=cores, overhead_ms=overhead_ms,
                   steps_spread_wall_ms=max(walls) - min(walls), steps_spread_cpu_ms=max(cpus) - min(cpus))

    def wall_ms(self, less_noise: bool = False) -> float:
        """The calls' wall time per call: the batch less the judge's steps (and, `less_noise`, less their spread)."""
        return (self.full_wall_ms - self.steps_wall_ms - (self.steps_spread_wall_ms if less_noise else 0.0)) / self.calls

    def cpu_ms(self, less_noise: bool = False) -> float:
        """The calls' CPU time per call, likewise."""
        return (self.full_cpu_ms - self.steps_cpu_ms - (self.steps_spread_cpu_ms if less_noise else 0.0)) / self.calls


def allowance_ms(b: Batches, less_noise: bool = False) -> float:
    """(CUDA) What a GPU time may be under the parent's per-call wall time: the parent's measured overhead, at most
    CUDA_ALLOWANCE of that time."""
    return max(0.0, min(b.overhead_ms, CUDA_ALLOWANCE * b.wall_ms(less_noise)))


def parent_bound_ms(b: Batches, cuda: bool, less_noise: bool = False) -> float:
    """The least time per call the parent's clock allows (never negative); `less_noise`: less the judge's noise."""
    if cuda:
        return max(0.0, b.wall_ms(less_noise) - allowance_ms(b, less_noise))
    return max(0.0, min(b.wall_ms(less_noise), b.cpu_ms(less_noise)))


def bounded(timing: Timing, bound_ms: float) -> Timing:
    """`timing` with `parent_ms` recorded, and raised to `bound_ms` (every sample scaled alike) where under it."""
    if timing.median_ms >= bound_ms or timing.median_ms <= 0:
        return timing.model_copy(update={"parent_ms": bound_ms})
    k = bound_ms / timing.median_ms
    raised = summarize([s * k for s in timing.samples_ms], clock=timing.clock, l2_flushed=timing.l2_flushed,
                       host_ms=timing.host_ms, lead_ms=timing.lead_ms)
    return raised.model_copy(update={"call": timing.call, "parent_ms": bound_ms, "median_ms": bound_ms})


def decide(timing: Timing, b: Batches, cuda: bool, raise_: bool = True) -> tuple[Timing | None, list[str]]:
    """The time that counts, or the reason there is none (timer-escape). Only the median the candidate's process
    reports is compared: nothing else it says (its host time) moves the bound or the escape line. With `raise_`
    False the bound is only recorded (`parent_ms`): rounds that are raised together, to one bound (`common`)."""
    bound = parent_bound_ms(b, cuda)
    if cuda:
        per_call, least, ratio = parent_bound_ms(b, cuda, less_noise=True), CUDA_ESCAPE_LEAST_MS, CUDA_ESCAPE_RATIO
        clock = (f"the parent's clock (less {allowance_ms(b, True):.4g} ms a call: the reference's host work, as the "
                 "judge measured it)") if b.overhead_ms > 0 else "the parent's clock"
    else:
        per_call = min(b.wall_ms(True), b.cpu_ms(True) / b.cores)
        least, ratio = CPU_ESCAPE_LEAST_MS, CPU_ESCAPE_RATIO
        clock = (f"both the parent's clock and the CPU time the kernel accounted to the candidate's processes over "
                 f"{b.cores} core(s)")
    if per_call > least and timing.median_ms < ratio * per_call:
        return None, [f"timer-escape: the timer saw {timing.median_ms:.4g} ms per call, but {b.calls} back-to-back "
                      f"calls took at best {per_call:.4g} ms each by {clock}, less the noise of the judge's steps: "
                      "work escaped the timed region, "
                      "or the call is bound by its host work"]
    return (bounded(timing, bound) if raise_ else timing.model_copy(update={"parent_ms": bound})), []


def measured_decision(timing: Timing, measured: Callable[[], Batches | list[str]], cuda: bool,
                      raise_: bool = True) -> tuple[Timing | None, list[str]]:
    """`decide` on the batches `measured` returns, measured again while it names an escape, ESCAPE_MEASUREMENTS
    times at most: an escape is rejected only where every measurement names it. A list from `measured` is a reason
    that is not the host's noise (an output not the oracle's), returned at once."""
    reasons: list[str] = []
    for k in range(ESCAPE_MEASUREMENTS):
        b = measured()
        if isinstance(b, list):
            return None, b
        t, reasons = decide(timing, b, cuda, raise_)
        if not reasons:
            return t, []
        log.info("measurement %d of %d names an escape: %s", k + 1, ESCAPE_MEASUREMENTS, reasons[0])
    return None, [f"{reasons[0]} (in each of {ESCAPE_MEASUREMENTS} measurements)"]


def common(rounds: list[Timing]) -> list[Timing]:
    """Rounds of one candidate each raised to the median of their bounds: each round's bound alone carries the host's
    noise (an honest 9 us CUDA kernel's five bounds were 0, 0, 0, 0 and 0.031 ms on an H200), and raising each round
    to its own made a stable kernel's rounds spread 234%."""
    bounds = sorted(t.parent_ms or 0.0 for t in rounds)
    if not bounds:
        return rounds
    mid = len(bounds) // 2
    bound = bounds[mid] if len(bounds) % 2 else (bounds[mid - 1] + bounds[mid]) / 2
    return [bounded(t, bound) for t in rounds]
