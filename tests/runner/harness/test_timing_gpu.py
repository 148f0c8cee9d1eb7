"""runner.harness.timing on the GPU: the host's wake-up after a call is not timed, work left on another stream is."""

from __future__ import annotations

import pytest
import torch

from runner.harness.timing import Timer, TimerConfig

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")]

CFG = TimerConfig(warmup=2, min_reps=10, max_reps=20, max_seconds=5)


def _cycles(ms: float) -> int:
    """torch.cuda._sleep's argument for about `ms` of spinning on this GPU (its clock measured, not looked up)."""
    n = 10_000_000
    torch.cuda._sleep(n)  # (the clock ramps up)
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    start.record()
    torch.cuda._sleep(n)
    end.record()
    end.synchronize()
    return int(n * ms / start.elapsed_time(end))


def test_a_call_that_does_nothing_times_near_zero():
    """The old timer (end event after the device-wide sync) gave 12 us for a call that does nothing on the H100; the
    start and end events queued behind the lead's spin, 3-10 us (median 9.4 on the H100)."""
    timer = Timer("cuda", CFG)
    assert timer.measure(lambda: None).median_ms < 0.012


def test_work_left_on_another_stream_is_timed():
    timer = Timer("cuda", CFG)
    side = torch.cuda.Stream()
    spin = _cycles(2.0)

    def on_side():
        with torch.cuda.stream(side):
            torch.cuda._sleep(spin)  # nothing waits for it: only the device-wide sync sees it

    own = timer.measure(lambda: torch.cuda._sleep(spin)).median_ms
    escaped = timer.measure(on_side).median_ms
    assert own > 1.0, own
    assert escaped > 0.8 * own, (escaped, own)


def test_the_hosts_work_before_the_kernel_is_not_timed_but_reported():
    """150 us of Python before a 0.2 ms kernel: the flush (~35 us on the H100) alone would leave the GPU idle for
    most of it, inside the events."""
    import time

    timer = Timer("cuda", CFG)
    spin = _cycles(0.2)

    def busy_host():
        t0 = time.perf_counter()
        while time.perf_counter() - t0 < 150e-6:
            pass
        torch.cuda._sleep(spin)

    alone = timer.measure(lambda: torch.cuda._sleep(spin))
    slow = timer.measure(busy_host)
    assert slow.median_ms < alone.median_ms * 1.1 + 0.01, (slow.median_ms, alone.median_ms)
    assert slow.host_ms >= 0.15 > alone.host_ms, (slow.host_ms, alone.host_ms)
    assert slow.lead_ms >= 0.15
