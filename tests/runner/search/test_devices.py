"""A search over several fake GPUs (runner/harness/gpus.py DeviceSet of table evaluators): the search's queue feeds
every device at once, even when its chunks are small, and each verdict in the trace names the device it came from."""

from __future__ import annotations

import threading

from runner.contract import Candidate, Environment, SearchBudget, Verdict
from runner.harness.gpus import DeviceSet
from runner.search.loop import search
from runner.search.trace import read_events
from tests.fakes.evaluators import TableEvaluator

from .test_loop import CTX, Scripted


class FakeGpu(TableEvaluator):
    """A table evaluator whose verdicts carry an environment; it notes which candidates it saw at the same time as
    the other device (a barrier both must reach while evaluating their first candidate)."""

    def __init__(self, barrier: threading.Barrier) -> None:
        super().__init__()
        self.barrier = barrier

    def evaluate(self, candidate: Candidate) -> Verdict:
        if len(self.evaluated) == 0:
            self.barrier.wait()  # both devices are evaluating at once, or this times out
        v = super().evaluate(candidate)
        return v.model_copy(update={"environment": Environment(device="cuda", torch="2", python="3", fusebot="0")})


def test_every_device_evaluates_at_once_and_each_verdict_names_its_device(tmp_path):
    barrier = threading.Barrier(2, timeout=20)
    gpus = {"cuda:0": FakeGpu(barrier), "cuda:1": FakeGpu(barrier)}
    devices = DeviceSet(gpus)
    budget = SearchBudget(rounds=1, ideas_per_round=4, implementations_per_idea=2, wall_seconds=60)
    try:
        result = search(CTX, devices, [Scripted("p", lambda r, k, j: f"ms=0.{k}{j + 1}")], budget,
                        tmp_path / "trace.jsonl", chunk=1)  # a chunk of one still feeds both devices
    finally:
        devices.close()
    # both evaluated (the barrier: at once); how the other six split between them is the host's scheduling
    assert result.candidates == 8 and all(g.evaluated for g in gpus.values())
    assert sum(len(g.evaluated) for g in gpus.values()) == 8
    evaluated = [e for e in read_events(tmp_path / "trace.jsonl") if e["event"] == "evaluated"]
    by_device = {label: {c.id for c in g.evaluated} for label, g in gpus.items()}
    assert len(evaluated) == 8
    for e in evaluated:
        assert e["candidate"]["id"] in by_device[e["verdict"]["environment"]["device"]]
    assert result.best.verdict.environment.device in gpus
