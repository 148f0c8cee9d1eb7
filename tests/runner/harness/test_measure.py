"""The parent's wall-clock cross-check of a candidate's own timer (runner.harness.measure.measure), with a stand-in worker."""

import time

from runner.harness.evaluator import Evaluator
from runner.harness.measure import measure
from runner.harness.timing import summarize

from ..conftest import scale_relu_spec


class StandIn:
    """Answers `time` with a timing its process reported, and takes `wall_ms_per_call` per call on `wall`."""

    def __init__(self, reported_ms: float, wall_ms_per_call: float):
        self.reported_ms, self.wall_ms = reported_ms, wall_ms_per_call
        self.last = None

    def send(self, msg):
        self.last = msg

    def receive(self, cmd, timeout_s, siblings=()):
        if cmd == "time":
            t = summarize([self.reported_ms] * 10, clock="monotonic", l2_flushed=True)
            return {"ok": True, "timing": t.model_dump()}
        time.sleep(self.last["calls"] * self.wall_ms / 1e3)
        return {"ok": True}


def test_a_timer_that_sees_less_than_half_the_wall_time_is_an_escape():
    ev = Evaluator(scale_relu_spec(), backend="cpu")
    ev.contestants.device = "cuda"  # the cross-check runs for CUDA candidates only; the stand-in needs no GPU
    ev.reference.out_specs[0] = ([{"shape": [64, 256], "dtype": "torch.float32"}], "tensor")
    try:
        timing, reasons = measure(ev.contestants, StandIn(reported_ms=0.5, wall_ms_per_call=2.0), ev.reference)
        assert timing is None and reasons[0].startswith("timer-escape"), reasons
        timing, reasons = measure(ev.contestants, StandIn(reported_ms=2.0, wall_ms_per_call=2.1), ev.reference)
        assert reasons == [] and timing.median_ms == 2.0
        ev.contestants.device = "cpu"  # on the CPU both clocks are wall clocks: no cross-check
        timing, reasons = measure(ev.contestants, StandIn(reported_ms=0.5, wall_ms_per_call=2.0), ev.reference)
        assert reasons == [] and timing.median_ms == 0.5
    finally:
        ev.close()
