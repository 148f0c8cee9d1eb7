from pathlib import Path

import pytest

from runner.contract import ProblemSpec
from runner.harness.evaluator import Evaluator, HarnessConfig

FIXTURES = Path(__file__).parent.parent / "fixtures"
PROBLEMS = FIXTURES / "problems"

# Short timing loops: these tests check verdicts, not speed.
FAST_TIMER = {"warmup": 1, "min_reps": 5, "max_reps": 20, "max_seconds": 1.0, "check_every": 5}


def scale_relu_spec() -> ProblemSpec:
    return ProblemSpec(name="scale_relu", path=str(PROBLEMS / "scale_relu.py"), second_inputs="get_second_inputs")


@pytest.fixture(scope="module")
def cpu_evaluator(harness_cache):
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        yield ev
