"""runner.harness.timing's CUDA sample arithmetic with a simulated device clock (no GPU): the call's own span on its stream,
plus how much longer the device-wide sync after it took than the same sync after a no-op queued right after it."""

from __future__ import annotations

import pytest

from runner.harness import timing


class _Clock:
    """Device time in ms: a call runs `own` on the caller's stream and leaves `side` on another stream; the host's
    sync returns `latency` after the device is idle."""

    def __init__(self, latency: float):
        self.now, self.latency, self.side_left = 0.0, latency, 0.0


class _Event:
    def __init__(self, enable_timing: bool = False):
        self.t = None


@pytest.fixture
def clock(monkeypatch):
    c = _Clock(latency=0.012)

    def record(e):
        e.t = c.now

    def sync():  # device-wide: waits for the other stream, then the host wakes up
        c.now += c.side_left + c.latency
        c.side_left = 0.0

    monkeypatch.setattr(timing, "_Event", _Event)
    monkeypatch.setattr(timing, "_event_record", record)
    monkeypatch.setattr(timing, "_event_sync", lambda e: None)
    monkeypatch.setattr(timing, "_event_elapsed", lambda a, b: b.t - a.t)
    monkeypatch.setattr(timing, "_cuda_sync", sync)
    monkeypatch.setattr(timing, "_perf_ns", lambda: int(c.now * 1e6))  # (the host reads the same clock)
    monkeypatch.setattr(timing, "_sleep", None)  # (this clock has no host work: no lead; see _Queue below)
    return c


def _call(c: _Clock, own: float, side: float):
    def fn():
        c.now += own
        c.side_left = max(0.0, side - own)  # (started with the call: only what outlasts it is left)
    return fn


def test_the_hosts_wake_up_is_not_timed(clock):
    timer = timing.Timer("cpu", flush_bytes=1024)
    assert timer._one_cuda(_call(clock, 0.25, 0.0)) == pytest.approx(0.25)


def test_work_left_on_another_stream_is_timed(clock):
    timer = timing.Timer("cpu", flush_bytes=1024)
    assert timer._one_cuda(_call(clock, 0.05, 2.0)) == pytest.approx(2.0)
    assert timer._one_cuda(_call(clock, 0.30, 0.10)) == pytest.approx(0.30)  # finished inside the call's own span


def test_a_host_that_wakes_up_slower_now_is_not_charged(clock):
    """The host's sync latency drifts with its speed (7-53 us on the H100 for one call in different processes and
    moments): a floor measured once charged the difference; the no-op after each call sees the same latency."""
    timer = timing.Timer("cpu", flush_bytes=1024)
    assert timer._one_cuda(_call(clock, 0.25, 0.0)) == pytest.approx(0.25)
    clock.latency = 0.040
    assert timer._one_cuda(_call(clock, 0.25, 0.0)) == pytest.approx(0.25)
    assert timer._one_cuda(_call(clock, 0.05, 2.0)) == pytest.approx(2.0)


def _noisy_syncs(clock, monkeypatch, jitter_ms: list[float]) -> None:
    """Each device-wide sync's host latency varies by the next of `jitter_ms` (in turn): the paired no-op's sync
    no longer cancels the call's exactly."""
    turn = iter(jitter_ms * 1000)

    def sync():
        clock.now += clock.side_left + clock.latency + next(turn)
        clock.side_left = 0.0

    monkeypatch.setattr(timing, "_cuda_sync", sync)


def _cuda_measure(fn):
    timer = timing.Timer("cpu", timing.TimerConfig(warmup=1, min_reps=20, max_reps=20), flush_bytes=1024)
    timer.device = "cuda"
    return timer.measure(fn)


def test_tails_at_the_hosts_noise_are_not_added_to_the_samples(clock, monkeypatch):
    """The paired syncs' differences scatter around zero when nothing ran on another stream; adding their positive
    half to every sample made a 7 us module's baselines 1-1.5 us slower on the H100."""
    _noisy_syncs(clock, monkeypatch, [0.002, 0.0, 0.0])  # tails of 0, +2 and -2 us, by turns
    t = _cuda_measure(_call(clock, 0.007, 0.0))
    assert t.median_ms == pytest.approx(0.007) and max(t.samples_ms) == pytest.approx(0.007)


def test_work_left_on_another_stream_on_every_call_is_still_timed_through_the_noise(clock, monkeypatch):
    _noisy_syncs(clock, monkeypatch, [0.002, 0.0, 0.0])
    t = _cuda_measure(_call(clock, 0.007, 0.050))  # 50 us on a side stream each call
    assert t.median_ms == pytest.approx(0.050, abs=0.0021)


class _Queue:
    """Host and GPU on one clock in us: the host launches work (a flush of `flush_us`, a spin, the call's kernels of
    `kernel_us` after `host_us` of its own work), the GPU runs it in order as soon as it is launched and the GPU is
    free; an event's time is when the GPU reaches it."""

    def __init__(self, host_us: float, kernel_us: float, flush_us: float = 35.0, cycles_per_us: float = 1980.0):
        self.host, self.gpu = 0.0, 0.0
        self.host_us, self.kernel_us, self.flush_us, self.cycles_per_us = host_us, kernel_us, flush_us, cycles_per_us

    def launch(self, us: float) -> None:
        self.gpu = max(self.gpu, self.host) + us
        self.host += 2.0  # a launch's own host cost

    def call(self) -> None:
        self.host += self.host_us
        self.launch(self.kernel_us)


@pytest.fixture
def queue(monkeypatch):
    q = _Queue(host_us=80.0, kernel_us=180.0)

    def record(e):
        e.t = max(q.gpu, q.host)
        q.gpu = e.t

    def sync_to(t):
        q.host = max(q.host, t) + 10.0

    monkeypatch.setattr(timing, "_Event", _Event)
    monkeypatch.setattr(timing, "_event_record", record)
    monkeypatch.setattr(timing, "_event_sync", lambda e: sync_to(e.t))
    monkeypatch.setattr(timing, "_event_elapsed", lambda a, b: (b.t - a.t) / 1000.0)
    monkeypatch.setattr(timing, "_cuda_sync", lambda: sync_to(q.gpu))
    monkeypatch.setattr(timing, "_sleep", lambda cycles: q.launch(cycles / q.cycles_per_us))
    monkeypatch.setattr(timing, "_perf_ns", lambda: int(q.host * 1000))
    monkeypatch.setattr(timing, "_zero", lambda buf: q.launch(q.flush_us))
    return q


def _cuda_timer():
    timer = timing.Timer("cpu", timing.TimerConfig(warmup=3, min_reps=10, max_reps=40), flush_bytes=1024)
    timer.device = "cuda"  # the CUDA path on the simulated queue
    return timer


def test_the_hosts_work_before_the_kernels_is_not_timed(queue):
    """80 us of host work against a 35 us flush: without a lead the events would time 45 us of an idle GPU."""
    t = _cuda_timer().measure(queue.call)
    assert t.median_ms == pytest.approx(0.180, abs=0.002), t.median_ms
    assert t.host_ms == pytest.approx(0.080 + 0.006, abs=0.004)  # the flush's, the spin's and the call's launches
    assert 0.080 <= t.lead_ms <= 0.2


def test_without_the_lead_the_gap_was_timed(queue, monkeypatch):
    monkeypatch.setattr(timing, "_sleep", None)
    t = _cuda_timer().measure(queue.call)
    assert t.median_ms == pytest.approx(0.180 + 0.080 + 0.004 - 0.035, abs=0.003)


def test_a_call_that_slows_down_on_the_host_is_taken_again_with_a_longer_lead(queue):
    timer = _cuda_timer()
    timer.measure(queue.call)
    queue.host_us = 400.0  # now 400 us of host work a call: the first sample's lead falls short
    lead_before = timer.lead_us
    one = timer._one_cuda(queue.call)
    assert one == pytest.approx(0.180, abs=0.002), one
    assert timer._max_lead_us > 400.0 > lead_before  # that sample ran behind a longer lead


def test_one_slow_call_does_not_lengthen_the_lead_of_the_samples_after_it(queue):
    """The lead is a window in which a call's own work on another stream goes untimed: an outlier's longer lead is
    that sample's alone; the lead follows the median host time, so a host that stays slower does raise it."""
    timer = _cuda_timer()
    timer.measure(queue.call)
    queue.host_us = 400.0
    timer._one_cuda(queue.call)
    queue.host_us = 80.0
    assert timer.lead_us < 200.0  # back behind the short lead (the ratchet kept ~600 us)
    queue.host_us = 400.0
    samples = [timer._one_cuda(queue.call) for _ in range(40)]
    assert all(x == pytest.approx(0.180, abs=0.002) for x in samples)
    assert timer.lead_us > 400.0


def test_the_lead_is_capped_and_what_outlasts_it_is_timed(queue):
    queue.host_us = 3000.0
    t = _cuda_timer().measure(queue.call)
    assert t.lead_ms == pytest.approx(timing.MAX_LEAD_US / 1000.0)
    # the GPU idled for the host's 3 ms less the flush and the 1 ms lead (and the launches before the call)
    assert t.median_ms == pytest.approx(0.180 + 3.0 - 0.035 - 1.0 + 0.004, abs=0.01), t.median_ms
