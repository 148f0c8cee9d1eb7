"""A broken problem is a ProblemError naming the file, the line and the cause: never a bare traceback, never a hang."""

import pytest

from runner.contract import Candidate, ProblemSpec
from runner.errors import ProblemError
from runner.harness.evaluator import Evaluator, HarnessConfig

from ..adversarial import HONEST_FAST
from ..conftest import FAST_TIMER, PROBLEMS

BROKEN = PROBLEMS / "broken"


def _evaluate(name: str, cache, **cfg):
    spec = ProblemSpec(name=name, path=str(BROKEN / f"{name}.py"))
    config = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=cache, **cfg)
    with Evaluator(spec, backend="cpu", config=config) as ev:
        return ev.evaluate(Candidate(id="c", format="fast", backend="cpu", sources=HONEST_FAST))


@pytest.mark.parametrize(
    ("name", "stage", "line", "cause"),
    [
        ("import_error", "import", 3, "ModuleNotFoundError"),
        ("inputs_error", "inputs", 10, "RuntimeError"),
        ("reference_error", "reference", 6, "ValueError: the reference is broken"),
    ],
)
def test_broken_problem_names_file_line_and_cause(harness_cache, name, stage, line, cause):
    with pytest.raises(ProblemError) as info:
        _evaluate(name, harness_cache)
    err = info.value
    assert err.stage == stage
    assert err.where == f"{BROKEN / name}.py:{line}"
    assert cause in err.cause


@pytest.mark.parametrize(("name", "stage", "line", "cause"), [
    ("inputs_error", "inputs", 10, "RuntimeError"),
    ("reference_error", "reference", 6, "ValueError: the reference is broken"),
])
def test_a_broken_problem_is_a_problem_error_when_its_baselines_run_first(harness_cache, name, stage, line, cause):
    """With a model configured the baselines are the judge's first request after init: get_inputs() or forward
    failing there is the user's mistake at their line, not a broken judge (a MachineError)."""
    spec = ProblemSpec(name=name, path=str(BROKEN / f"{name}.py"))
    config = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=config) as ev, pytest.raises(ProblemError) as info:
        ev.baselines()
    assert (info.value.stage, info.value.where) == (stage, f"{BROKEN / name}.py:{line}")
    assert cause in info.value.cause


def test_hanging_input_factory_is_a_problem_error_not_a_hang(harness_cache):
    with pytest.raises(ProblemError) as info:
        _evaluate("inputs_hang", harness_cache, trial_timeout_s=2)
    assert "did not finish within 2 s" in info.value.cause


def test_missing_file_is_a_problem_error(tmp_path):
    spec = ProblemSpec(name="nope", path=str(tmp_path / "nope.py"))
    with Evaluator(spec, backend="cpu", config=HarnessConfig(cache_dir=tmp_path)) as ev, pytest.raises(ProblemError):
        ev.reference_source()


def test_a_module_that_adopted_a_dropin_is_loaded_as_its_original_class(tmp_path):
    """The module's name binds the drop-in's subclass (the edit a kernel PR makes): the problem is the class it
    replaced, so a later search times and verifies against the original, never the kernel merged before."""
    from runner.harness.problem import load

    (tmp_path / "m.py").write_text(
        "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        return x + 1\n\n\n"
        "def get_inputs():\n    return [torch.ones(2)]\n\n\n"
        "class Fused(M):\n    def forward(self, x):\n        return x + 2\n\n\n"
        "Fused.fusebot_original = M\nM = Fused\n")
    loaded = load(ProblemSpec(name="m", path=str(tmp_path / "m.py"), class_name="M"))
    assert loaded.model_cls.__name__ == "M" and "fusebot_original" not in vars(loaded.model_cls)
