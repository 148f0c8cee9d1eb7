"""The baselines are timed while the catalog's first kernels are generated and built: the builds start before the
baselines are in, and no candidate is evaluated (the judge's next request) until they are."""

from __future__ import annotations

import threading

from runner.contract import ProblemSpec, SearchBudget
from runner.pipeline import optimize_problem
from tests.fakes.evaluators import PipelineTable
from tests.runner.search.test_loop import Scripted


class Judge(PipelineTable):
    def __init__(self):
        super().__init__()
        self.building = threading.Event()  # a candidate went to the builds ahead
        self.measured = threading.Event()
        self.order: list[str] = []

    def baselines(self):
        # only returns once the search's first candidate is building: the two overlap, or this test fails
        assert self.building.wait(30), "no build started while the baselines were timed"
        self.order.append("baselines")
        self.measured.set()
        return super().baselines()

    def prebuild(self, candidates):
        self.order.append("prebuild")
        self.building.set()

    def evaluate_many(self, candidates):
        assert self.measured.is_set(), "a candidate was evaluated before the baselines were in"
        self.order.append("evaluate")
        return super().evaluate_many(candidates)


def test_the_first_builds_start_while_the_baselines_are_timed(tmp_path):
    judge = Judge()
    o = optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path,
                         SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1, wall_seconds=3600),
                         [Scripted("a", lambda r, k, j: "ms=0.5")], judge, "cpu")
    assert judge.order[:3] == ["prebuild", "baselines", "evaluate"]
    assert o.baselines is not None and o.baselines.eager.median_ms == 1.0
