"""Baselines cached per problem (its source), device, torch version and inputs, in the harness's cache directory: a
second search of the same module does not time eager and torch.compile again; any change of those times them anew."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.contract import Baselines, ProblemSpec
from runner.harness.config import HarnessConfig
from runner.harness.plan import Seeds
from runner.harness.reference import Reference
from tests.fakes.evaluators import timing

INFO = {"source": "class Model: ...\ndef get_inputs(): ...\n", "shape_sets": 1,
        "environment": {"device": "cuda", "gpu": "NVIDIA H200", "driver": "570.1", "cuda": "12.8", "torch": "2.7.0",
                        "python": "3.12", "fusebot": "0"}}


class Counting(Reference):
    """The parent's side of the judge, with the judge's answers given: counts the baselines it times."""

    def __init__(self, cache_dir: Path, problem: ProblemSpec | None = None, info: dict | None = None,
                 config: HarnessConfig | None = None):
        super().__init__(problem or ProblemSpec(name="relu", path="/src/relu.py"), "cuda",
                         config or HarnessConfig(cache_dir=cache_dir), Seeds(), cache_dir, cache_dir)
        self.info = info or INFO
        self.timed = 0

    def start(self):
        return None

    def measure_baselines(self, label: str) -> Baselines:
        self.timed += 1
        return Baselines(eager=timing(1.0 + self.timed), compile=timing(0.5))


def test_a_second_search_of_the_same_module_does_not_time_the_baselines_again(tmp_path):
    first = Counting(tmp_path)
    measured = first.baselines()
    assert first.timed == 1 and first.baselines() == measured and first.timed == 1
    second = Counting(tmp_path)  # a rerun: a new judge, the same problem on the same machine
    assert second.baselines() == measured and second.timed == 0
    assert list((tmp_path / "baselines").glob("*.json"))


@pytest.mark.parametrize("change", [
    {"info": {**INFO, "source": INFO["source"] + "# edited\n"}},
    {"info": {**INFO, "environment": {**INFO["environment"], "torch": "2.8.0"}}},
    {"info": {**INFO, "environment": {**INFO["environment"], "gpu": "NVIDIA H100 80GB HBM3"}}},
    {"problem": ProblemSpec(name="relu", path="/src/relu.py", input_shapes=[[4096, 4096]])},
    {"problem": ProblemSpec(name="relu", path="/src/relu.py", dtype="bfloat16")},
])
def test_another_source_torch_device_or_input_times_them_anew(tmp_path, change):
    Counting(tmp_path).baselines()
    other = Counting(tmp_path, **change)
    other.baselines()
    assert other.timed == 1


def test_the_cache_lives_in_the_harness_cache_dir_from_fusebot_cache_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_CACHE_DIR", str(tmp_path / "cache"))
    from runner.harness.evaluator import Evaluator

    ev = Evaluator(ProblemSpec(name="relu", path=str(tmp_path / "relu.py")), backend="cpu")
    try:
        assert ev.reference.cache_dir == tmp_path / "cache"
    finally:
        ev.close()
