"""The timer: one function, used for the reference's baselines and for candidates alike.

On CUDA: events around each call on the caller's stream, then, once its end event has fired, a device-wide synchronize
timed on the host: how much longer it took than the same synchronize after a call that does nothing, queued right
after behind the same flush and lead, is added to the sample. So work a callee left on any other stream is inside the
measurement (once the tails' median says work was left there, `TAIL_NOISE_US`; below it they are the host's noise, and
the samples are the events' own spans), but the host's own latency is not: it drifts with the host's speed, and a
floor measured once (the least of 20 no-op calls, as an earlier timer did) charged torch.compile's MinGPT GELU, 182 us
on its own stream on the H100 with a spread of 2 us, 7-53 us more depending on the process and the moment; against the
paired no-op, 1-2 us (docs/measurements.md, "The timer"). The L2 is flushed before every timed call by writing a
buffer twice its size; warm-up, then repetitions until the median stops moving. On CPU: the same with a monotonic
clock and a buffer larger than the last-level cache.

The host's own work before the call's first kernel is not timed either: after the flush a one-thread spin
(`torch.cuda._sleep`) keeps the GPU busy for `lead_us`, half as much again as the host time the call took in its
warm-up (at most 1 ms), so the call's kernels are queued before the start event fires. Without it the events timed
the GPU idling while the host ran the call's Python: on the H100 torch.compile's MinGPT GELU took 0.21-0.23 ms that
way, its host work 83-105 us a call, against 0.1820-0.1825 ms with the GPU kept busy (eager tanh, 32 us of host
work: 0.182 both ways; correlation of sample time and host time 0.96-0.98; docs/measurements.md, "The timer"). A
sample whose host work outlasted the lead is taken again behind a longer one, that sample alone; the lead then
follows the median host time of the samples so far (`Timing.lead_ms`: the longest any kept sample ran behind). The
host time per call is reported beside the GPU time (`Timing.host_ms`). What this gives up: work a call puts on
another stream of its own can run during the lead, before the start event, untimed: at most the lead less the host
time before that launch, so up to half the call's host time for work launched at its end, and up to the whole lead
for work launched at its start and overlapped with host work of its own (the parent's wall-clock cross-check,
runner.harness.evaluator, catches that once it is more than the timed time; the flush gave the same room before, ~35 us). A
gate that fills every SM during the lead would close it.

Every callable used here is bound when this module is imported, which the children do before any untrusted code
runs: a candidate that later replaces `torch.cuda.synchronize` or `Event.elapsed_time` does not reach this timer
(and runner.harness.guards reports that it tried).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

from runner.contract import Timing

_perf_ns = time.perf_counter_ns
_monotonic = time.monotonic
_cuda_sync = torch.cuda.synchronize
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_sync = torch.cuda.Event.synchronize
_event_elapsed = torch.cuda.Event.elapsed_time
_zero = torch.Tensor.zero_
_median = statistics.median
_sleep = getattr(torch.cuda, "_sleep", None)

MAX_LEAD_US = 1000.0
# The paired sync's difference is noise unless a call left work on another stream: on the H100 its median per
# measurement was 0.7-2.3 us with nothing on any other stream (eager and torch.compile of a 7 us module; a 182 us
# GELU: 0.8-2.1 us), its p10-p90 per sample -8.6 to 13.4 us. Added sample by sample (the positive half of that
# noise) it put 1-1.5 us on every baseline of the 7 us module (0.87x stated where its bench script measured 0.76x).
# So the tails count only when their median says work was left: above this, every sample keeps its own tail.
TAIL_NOISE_US = 3.0


def _nothing() -> None:
    return None


def pin(cores: list[int] | None) -> None:
    """CPU timing: this process on `cores` only, torch's intra-op pool one thread per core (the judge, timing the
    baselines, and every candidate's process alike), so that two measurements run on the same resources."""
    if cores:
        os.sched_setaffinity(0, cores)
        torch.set_num_threads(len(cores))


def _lead_for(host_us: float) -> float:
    """The lead for a call whose host work took `host_us`: half as much again, and no longer, since work a call puts
    on another stream of its own can run during it, untimed (the factor measured on the H100)."""
    return min(MAX_LEAD_US, 1.5 * host_us)


@dataclass
class TimerConfig:
    warmup: int = 3
    min_reps: int = 10
    max_reps: int = 500
    max_seconds: float = 10.0
    stable_rel: float = 0.01  # stop when the median moved less than this between checks
    check_every: int = 10


def _quartiles(samples: list[float]) -> tuple[float, float]:
    qs = statistics.quantiles(samples, n=4, method="inclusive") if len(samples) > 1 else [samples[0]] * 3
    return qs[0], qs[2]


def summarize(samples_ms: list[float], *, clock: str, l2_flushed: bool, host_ms: float | None = None,
              lead_ms: float = 0.0) -> Timing:
    q1, q3 = _quartiles(samples_ms)
    return Timing(
        median_ms=_median(samples_ms),
        iqr_ms=q3 - q1,
        mean_ms=statistics.fmean(samples_ms),
        min_ms=min(samples_ms),
        n=len(samples_ms),
        samples_ms=list(samples_ms),
        clock=clock,
        l2_flushed=l2_flushed,
        host_ms=host_ms,
        lead_ms=lead_ms,
    )


class Timer:
    """`Timer(device).measure(fn)` -> Timing. `fn` is called with no arguments; its result is discarded."""

    def __init__(self, device: str, config: TimerConfig | None = None, flush_bytes: int | None = None):
        self.device = device
        self.config = config or TimerConfig()
        if device.startswith("cuda"):
            l2 = getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 50 << 20) or (50 << 20)
            self.flush_bytes = flush_bytes or max(2 * l2, 64 << 20)
        else:
            self.flush_bytes = flush_bytes or (64 << 20)  # larger than any last-level cache we run on
        self._flush_buf = torch.empty(self.flush_bytes // 4, dtype=torch.int32, device=device)
        self._cycles_per_us: float | None = None
        self.lead_us = 0.0  # GPU spin queued after the flush, so the call's host work is not timed
        self._host_ms: list[float] = []
        self._tails_ms: list[float] = []  # per sample of the current measurement: the paired sync's difference
        self._max_lead_us = 0.0  # the longest lead a kept sample of the current measurement ran behind
        self._before: Callable[[], object] = _nothing
        self._after: Callable[[], object] = _nothing

    def flush(self) -> None:
        _zero(self._flush_buf)

    def _lead_cycles(self, lead_us: float | None = None) -> int:
        """A lead (the timer's own by default) in clock cycles of this GPU (its clock measured once, by timing a
        spin)."""
        lead_us = self.lead_us if lead_us is None else lead_us
        if lead_us <= 0 or _sleep is None:
            return 0
        if self._cycles_per_us is None:
            n = 2_000_000
            _sleep(n)  # (the clock ramps up)
            start, end = _Event(enable_timing=True), _Event(enable_timing=True)
            _event_record(start)
            _sleep(n)
            _event_record(end)
            _event_sync(end)
            self._cycles_per_us = n / max(_event_elapsed(start, end) * 1000.0, 1e-3)
        return int(lead_us * self._cycles_per_us)

    def _sync_ms(self) -> float:
        t0 = _perf_ns()
        _cuda_sync()
        return (_perf_ns() - t0) / 1e6

    def _spans(self, fn: Callable[[], object], lead_cycles: int = 0) -> tuple[float, float, float]:
        """(start -> end on the caller's stream; how much longer the device-wide sync after it took than the same
        sync after a no-op queued behind the same flush and lead (may be below zero); the host's time from the
        flush to the call's return), in ms, for one flushed call."""
        start, end, mark = _Event(enable_timing=True), _Event(enable_timing=True), _Event(enable_timing=True)
        self._before()
        t0 = _perf_ns()
        self.flush()
        if lead_cycles:
            _sleep(lead_cycles)
        _event_record(start)
        fn()
        host_ms = (_perf_ns() - t0) / 1e6
        _event_record(end)
        _event_sync(end)
        tail = self._sync_ms()  # waits for what the call left on other streams
        self.flush()
        if lead_cycles:
            _sleep(lead_cycles)
        _event_record(mark)
        _event_sync(mark)
        self._after()
        return _event_elapsed(start, end), tail - self._sync_ms(), host_ms

    def _one_cuda(self, fn: Callable[[], object]) -> float:
        lead_us = self.lead_us
        for _ in range(3):
            own, extra, host_ms = self._spans(fn, self._lead_cycles(lead_us))
            if host_ms * 1000.0 <= lead_us or lead_us >= MAX_LEAD_US or _sleep is None:
                break
            # the host was still launching when the GPU ran out of queued work: the gap is in `own`; this sample
            # again behind a longer lead (the later ones keep theirs: a longer lead is a wider untimed window)
            lead_us = _lead_for(host_ms * 1000.0)
        self._host_ms.append(host_ms)
        self._tails_ms.append(extra)
        self._max_lead_us = max(self._max_lead_us, lead_us if _sleep is not None else 0.0)
        self.lead_us = _lead_for(_median(self._host_ms) * 1000.0)  # follows the host's speed, not its outliers
        return own + max(0.0, extra)  # work past the end event on any stream counts (unless `_tails_count` says no)

    def _tails_count(self) -> bool:
        """Whether the measurement's paired-sync tails are work left on another stream, not the host's noise."""
        return not self._tails_ms or _median(self._tails_ms) * 1000.0 > TAIL_NOISE_US

    def _without_noise(self, samples: list[float]) -> list[float]:
        """The samples, less the tails where those are noise (`TAIL_NOISE_US`): the events' own spans."""
        if self._tails_count():
            return samples
        return [s - max(0.0, t) for s, t in zip(samples, self._tails_ms, strict=True)]

    def _one_cpu(self, fn: Callable[[], object]) -> float:
        self._before()
        self.flush()
        t0 = _perf_ns()
        fn()
        ms = (_perf_ns() - t0) / 1e6
        self._after()
        return ms

    def measure(self, fn: Callable[[], object], before: Callable[[], object] | None = None,
                after: Callable[[], object] | None = None) -> Timing:
        """Time `fn`. `before` runs before every call (warm-up included) and `after` after every timed one, both
        outside the timed region: the harness gives each call fresh inputs and samples what each call returned."""
        cfg = self.config
        cuda = self.device.startswith("cuda")
        one = self._one_cuda if cuda else self._one_cpu
        self._before, self._after = before or _nothing, after or _nothing
        host_us = 0.0
        for _ in range(cfg.warmup):
            self._before()
            t0 = _perf_ns()
            fn()
            host_us = (_perf_ns() - t0) / 1e3  # the last warm-up call's (the first may compile)
        if cuda:
            _cuda_sync()
            self.lead_us = _lead_for(host_us)
        self._host_ms, self._tails_ms = [], []
        self._max_lead_us = 0.0
        samples: list[float] = []
        deadline = _monotonic() + cfg.max_seconds
        last_median = None
        while len(samples) < cfg.max_reps:
            samples.append(one(fn))
            n = len(samples)
            if n >= cfg.min_reps and n % cfg.check_every == 0:
                med = _median(self._without_noise(samples))
                if last_median is not None and abs(med - last_median) <= cfg.stable_rel * last_median:
                    break
                last_median = med
            if n >= cfg.min_reps and _monotonic() > deadline:
                break
        return summarize(self._without_noise(samples), clock="cuda_events" if cuda else "monotonic", l2_flushed=True,
                         host_ms=_median(self._host_ms) if self._host_ms else None,
                         lead_ms=self._max_lead_us / 1000.0 if cuda else 0.0)

    def wall_per_call_ms(self, fn: Callable[[], object], calls: int) -> float:
        """Wall time per call over `calls` back-to-back calls ending in a device-wide sync (no flush)."""
        if self.device.startswith("cuda"):
            _cuda_sync()
        t0 = _perf_ns()
        for _ in range(calls):
            fn()
        if self.device.startswith("cuda"):
            _cuda_sync()
        return (_perf_ns() - t0) / 1e6 / calls
