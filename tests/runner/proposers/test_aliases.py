"""A repository target with its own class and factory names is read by proposers under KernelBench's names."""

from pathlib import Path

from runner.catalog.capture import capture_source
from runner.catalog.recognition import recognise
from runner.contract import ProblemSpec
from runner.pipeline import kernelbench_aliases

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"


def test_kernelbench_names_only_when_the_target_differs():
    assert kernelbench_aliases(ProblemSpec(name="kb")) == ""
    text = kernelbench_aliases(ProblemSpec(name="t", class_name="Block", inputs="make_x", init_args=[4, 8]))
    assert "Model = Block" in text and "get_inputs = make_x" in text and "return [4, 8]" in text


def test_the_catalog_recognises_a_repository_class_through_the_aliases():
    src = (EXAMPLES / "attention_softmax.py").read_text()
    cls = next(line.split("class ")[1].split("(")[0] for line in src.splitlines() if line.startswith("class "))
    assert cls != "Model"
    spec = ProblemSpec(name=cls, class_name=cls)
    assert recognise(capture_source(src)).family == "unsupported"  # without the aliases: no `Model`
    assert recognise(capture_source(src + kernelbench_aliases(spec))).family != "unsupported"
