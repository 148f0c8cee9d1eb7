"""Every GPU of a host in one process (runner/harness/gpus.py), on the CPU: fake evaluators per device for the queue
that feeds them, and real harness processes on N CPU "devices" (slices of the cores) for the per-device evaluator."""

from __future__ import annotations

import threading

import pytest

from runner.contract import Candidate, Environment, Verdict
from runner.errors import MachineError, UsageError
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.harness.gpus import (
    DeviceEvaluator,
    DeviceSet,
    device_evaluators,
    lanes,
    parse_gpus,
    physical_device,
)
from tests.fakes.evaluators import TableEvaluator

from ..adversarial import HONEST_KB
from ..conftest import FAST_TIMER, scale_relu_spec


class FakeDevice(TableEvaluator):
    """A fake GPU: the table evaluator, whose verdicts carry an environment, that records which thread ran it."""

    def __init__(self, name: str, barrier: threading.Barrier | None = None, **kw) -> None:
        super().__init__(**kw)
        self.name, self.barrier = name, barrier
        self.threads: set[str] = set()

    def evaluate(self, candidate: Candidate) -> Verdict:
        if self.barrier is not None and not self.evaluated:
            self.barrier.wait()  # every device is evaluating at once, or this times out
        self.threads.add(threading.current_thread().name)
        v = super().evaluate(candidate)
        return v.model_copy(update={"environment": Environment(device="cuda", gpu=self.name, torch="2", python="3",
                                                               fusebot="0")})


def fake(i: int, ms: float = 0.5) -> Candidate:
    return Candidate(id=f"c{i}", format="fast", backend="cpu", sources={"kernel.cpp": f"// FAKE: ms={ms}\n"})


def test_parse_gpus():
    assert parse_gpus(None, 4) == [0, 1, 2, 3] == parse_gpus("all", 4) == parse_gpus("", 4)
    assert parse_gpus("0,2", 4) == [0, 2] and parse_gpus([1], 2) == [1] and parse_gpus(None, 0) == []
    for bad, why in (("0,0", "twice"), ("4", "4 visible"), ("x", "device indices"), ("-1", "visible")):
        with pytest.raises(UsageError, match=why):
            parse_gpus(bad, 4)


def test_a_child_sees_the_host_device_behind_this_process_index():
    assert physical_device(1, {}) == "1"
    assert physical_device(1, {"CUDA_VISIBLE_DEVICES": "2,3"}) == "3"  # this process's device 1 is the host's 3
    assert physical_device(0, {"CUDA_VISIBLE_DEVICES": "GPU-aa, GPU-bb"}) == "GPU-aa"


def test_lanes_share_devices_among_the_searches_at_once():
    assert lanes([0, 1], 4) == [[0], [1]]  # targets outnumber GPUs: a search per GPU
    assert lanes([0, 1], 1) == [[0, 1]]  # one target: one search over both
    assert lanes([0, 1, 2, 3], 2) == [[0, 2], [1, 3]]
    assert lanes([], 3) == [[]]  # the CPU: one search at a time, as before


def test_a_device_set_shares_a_chunk_among_its_devices_and_names_each_ones():
    both = threading.Barrier(2, timeout=20)
    devs = {f"cuda:{i}": FakeDevice(f"GPU {i}", both) for i in range(2)}
    ds = DeviceSet(devs)
    try:
        verdicts = ds.evaluate_many([fake(i, 0.1 * (i + 1)) for i in range(8)])
    finally:
        ds.close()
    assert [v.candidate_id for v in verdicts] == [f"c{i}" for i in range(8)]  # the order given
    assert [v.timing.median_ms for v in verdicts] == pytest.approx([0.1 * (i + 1) for i in range(8)])
    by_device = {label: [c.id for c in d.evaluated] for label, d in devs.items()}
    assert sorted(sum(by_device.values(), [])) == sorted(f"c{i}" for i in range(8))  # each candidate once
    assert all(len(ids) >= 2 for ids in by_device.values())  # both worked, at once (the barrier), 2 at a time
    for v in verdicts:  # each verdict names the device that measured it
        assert v.candidate_id in by_device[v.environment.device]
    assert ds.lanes == 2 and ds.baselines() == devs["cuda:0"].baselines()


def test_a_broken_device_is_a_machine_error():
    called = threading.Event()

    class Dead(FakeDevice):
        def evaluate_many(self, candidates):
            called.set()
            raise MachineError("the judge died")

    class Waits(FakeDevice):  # leaves candidates in the queue until the dead device has taken one
        def evaluate_many(self, candidates):
            called.wait(10)
            return super().evaluate_many(candidates)

    ds = DeviceSet({"cuda:0": Waits("GPU 0"), "cuda:1": Dead("GPU 1")})
    try:
        with pytest.raises(MachineError, match="judge died"):
            ds.evaluate_many([fake(i) for i in range(4)])
    finally:
        ds.close()


def test_one_gpu_or_the_cpu_is_the_plain_evaluator(tmp_path):
    with device_evaluators(scale_relu_spec(), "cuda", [0], visible=1) as ev:
        assert isinstance(ev, Evaluator)  # a worker pinned to its GPU: nothing else to confine
    with device_evaluators(scale_relu_spec(), "cpu", []) as ev:
        assert isinstance(ev, Evaluator) and ev.config.cpu_cores is None


def test_cpu_devices_are_harness_processes_on_their_own_cores(harness_cache):
    """Two CPU "devices": a DeviceEvaluator each (the harness in its own process, as on a GPU), on disjoint cores;
    each candidate is verified and timed, against baselines measured by its own device's judge."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    honest = [Candidate(id=f"honest-{i}", format="kernelbench", backend="cpu", sources=HONEST_KB) for i in range(2)]
    with device_evaluators(scale_relu_spec(), "cpu", [0, 1], cfg) as ev:
        assert isinstance(ev, DeviceSet) and all(isinstance(d, DeviceEvaluator) for d in ev.evaluators.values())
        verdicts = ev.evaluate_many(honest)
        assert ev.baselines().eager.median_ms > 0
    assert all(v.accepted for v in verdicts), [v.reasons for v in verdicts]
    assert {v.environment.device for v in verdicts} == {"cpu:0", "cpu:1"}
    assert all(v.baselines.eager.median_ms > 0 for v in verdicts)
