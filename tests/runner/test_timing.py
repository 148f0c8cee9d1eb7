"""runner.timing's CUDA sample arithmetic with a simulated device clock (no GPU): the call's own span on its stream,
plus whatever the device-wide sync waited for beyond what it waits after a call that does nothing."""

from __future__ import annotations

import pytest

from runner import timing


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
    return c


def _call(c: _Clock, own: float, side: float):
    def fn():
        c.now += own
        c.side_left = max(0.0, side - own)  # (started with the call: only what outlasts it is left)
    return fn


def test_the_hosts_wake_up_is_not_timed(clock):
    timer = timing.Timer("cpu", flush_bytes=1024)
    assert timer._one_cuda(_call(clock, 0.25, 0.0)) == pytest.approx(0.25)
    assert timer.sync_floor_ms() == pytest.approx(0.012)


def test_work_left_on_another_stream_is_timed(clock):
    timer = timing.Timer("cpu", flush_bytes=1024)
    assert timer._one_cuda(_call(clock, 0.05, 2.0)) == pytest.approx(2.0)
    assert timer._one_cuda(_call(clock, 0.30, 0.10)) == pytest.approx(0.30)  # finished inside the call's own span


def test_a_slower_wake_up_than_the_no_ops_is_charged(clock):
    timer = timing.Timer("cpu", flush_bytes=1024)
    timer.sync_floor_ms()
    clock.latency = 0.020  # the host woke up 8 us later than after any no-op: counted, not forgiven
    assert timer._one_cuda(_call(clock, 0.25, 0.0)) == pytest.approx(0.258)
