"""The parent's wall-clock cross-check of a candidate's own timer (runner.harness.measure), with a stand-in child:
on every backend, the calls' own time (calls with their `before` steps, less the steps alone) by the parent's clock
must not be more than twice what the timer saw."""

import os
import time
from types import SimpleNamespace

import pytest

from runner.harness.evaluator import Evaluator
from runner.harness.measure import measure
from runner.harness.timing import summarize

from ..conftest import scale_relu_spec


class StandIn:
    """Answers `time` with a timing its process reported; on `wall` spends `call_ms` of CPU per call plus `hook_ms`
    per `before` step (the step alone with hooks_only), in this process, which stands in for the child's."""

    def __init__(self, reported_ms: float, call_ms: float, hook_ms: float = 0.0, burn: bool = True):
        self.reported_ms, self.call_ms, self.hook_ms, self.burn = reported_ms, call_ms, hook_ms, burn
        self.last = None
        self.workdir = "."
        self.proc = SimpleNamespace(pid=os.getpid())

    def send(self, msg):
        self.last = msg

    def receive(self, cmd, timeout_s, siblings=()):
        if cmd == "time":
            t = summarize([self.reported_ms] * 10, clock="monotonic", l2_flushed=True)
            return {"ok": True, "timing": t.model_dump()}
        per_call = self.hook_ms + (0.0 if self.last.get("hooks_only") else self.call_ms)
        if not self.burn:  # a GPU's time: the host waits (the CUDA check counts wall time)
            time.sleep(self.last["calls"] * per_call / 1e3)
            return {"ok": True}
        end = time.thread_time() + self.last["calls"] * per_call / 1e3
        while time.thread_time() < end:  # CPU time, as a CPU kernel spends it (the CPU check counts CPU time)
            pass
        return {"ok": True}


@pytest.fixture()
def ev():
    e = Evaluator(scale_relu_spec(), backend="cpu")
    e.config.cpu_check_ms = 100.0
    e.reference.out_specs[0] = ([{"shape": [64, 256], "dtype": "torch.float32"}], "tensor")
    yield e
    e.close()


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_a_timer_that_sees_less_than_half_the_wall_time_is_an_escape(ev, device, monkeypatch):
    ev.contestants.device = device  # the stand-in needs no GPU
    monkeypatch.setattr("psutil.Process.cpu_affinity", lambda self: [0])  # one core, as a pinned child has
    reported_ms = 0.5 if device == "cuda" else 0.1  # under half (CUDA) or a tenth (CPU) of the calls' cost
    timing, reasons = measure(ev.contestants, StandIn(reported_ms=reported_ms, call_ms=2.0, burn=device == "cpu"),
                              ev.reference)
    assert timing is None and reasons[0].startswith("timer-escape"), reasons
    timing, reasons = measure(ev.contestants, StandIn(reported_ms=2.0, call_ms=2.1, burn=device == "cpu"),
                              ev.reference)
    assert reasons == [] and timing.median_ms == 2.0


def test_the_before_steps_are_not_charged_to_the_call(ev, monkeypatch):
    monkeypatch.setattr("psutil.Process.cpu_affinity", lambda self: [0])
    """Fresh inputs for every timed call cost time outside the timed region: the cross-check subtracts them."""
    ev.contestants.device = "cpu"
    timing, reasons = measure(ev.contestants, StandIn(reported_ms=0.5, call_ms=0.5, hook_ms=1.5), ev.reference)
    assert reasons == [] and timing.median_ms == 0.5


@pytest.mark.parametrize("device", ["cpu", "cuda"])
def test_a_first_time_under_the_floor_not_held_in_a_fresh_process(monkeypatch, device):
    """On a GPU the floor is the memory system's and such a time is rejected; on a CPU the floor is a copy rate
    measured on a shared host (27-83 GB/s on one 2-core EPYC), and the fresh process's slower time is reported."""
    from runner.contract import Baselines, Roofline, Verdict
    from runner.harness import measure as m

    def timed(ms):
        return summarize([ms] * 10, clock="monotonic", l2_flushed=True)

    floor = Roofline(bytes_moved=1 << 20, bandwidth_bytes_per_s=1e9, bandwidth_source="test", floor_ms=1.0)
    ref = SimpleNamespace(device=device, tolerance_notes=set(), digests=[], roofline=lambda: floor,
                          baselines=lambda: Baselines(eager=timed(4.0), compile=None))
    monkeypatch.setattr(m, "measure", lambda *a: (timed(0.5), []))
    v = Verdict(candidate_id="c", problem="p", accepted=True)
    m.time_candidate(None, None, ref, v, lambda: (timed(2.0), []))
    if device == "cpu":
        assert not v.reasons and v.timing.median_ms == 2.0 and v.speedup_vs_eager == 2.0
        assert any(w.startswith("below-floor") and "did not hold in a fresh process" in w for w in v.warnings)
    else:
        assert v.reasons and v.reasons[0].startswith("below-floor") and v.timing is None
