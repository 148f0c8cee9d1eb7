"""Builds ahead of the evaluation (runner/harness/prebuild.py), and the search handing an answer's candidates to them
as it arrives."""

from __future__ import annotations

import threading

from runner.contract import Candidate, SearchBudget
from runner.harness.prebuild import Prebuilds
from runner.search.loop import search
from runner.search.types import ProblemContext
from tests.fakes.evaluators import TableEvaluator
from tests.runner.search.test_loop import Scripted


def fast(marker: str) -> Candidate:
    return Candidate(id=marker, format="fast", backend="cuda", sources={"kernel.cu": f"// {marker}\n"})


def test_a_candidate_is_built_once_ahead_and_its_chunk_waits_for_that_build():
    release, built = threading.Event(), []

    def build(c: Candidate) -> None:
        assert release.wait(30)
        built.append(c.id)

    ahead = Prebuilds(jobs=2)
    try:
        a, same_as_a = fast("a"), fast("a").model_copy(update={"id": "a-again"})
        kb = Candidate(id="kb", format="kernelbench", backend="cuda", sources={"m.py": "class ModelNew: ..."})
        ahead.start([a, kb], build)
        ahead.start([same_as_a], build)  # the same sources: no second build
        ahead.wait([fast("unknown")])  # nothing started for it: returns at once
        release.set()
        ahead.wait([a])
        assert built == ["a"]  # once, finished before the chunk's own build; a KernelBench file is not compiled
    finally:
        ahead.close()


def test_the_search_hands_each_answers_candidates_to_the_builds_ahead(tmp_path):
    seen, cond = set(), threading.Condition()

    class Ahead(TableEvaluator):
        def prebuild(self, candidates):
            with cond:
                seen.update(c.sources["kernel.cpp"] for c in candidates)
                cond.notify_all()

        def evaluate_many(self, candidates):
            with cond:  # (the proposer's thread hands them over just after its answer is in)
                assert cond.wait_for(lambda: all(c.sources["kernel.cpp"] in seen for c in candidates), 30)
            return super().evaluate_many(candidates)

    ev = Ahead()
    res = search(ProblemContext(name="relu", reference_source="class Model: ...", backend="cpu"), ev,
                 [Scripted("a", lambda r, k, j: "wrong" if k == 0 else f"ms={1 + k}", fix=lambda c: "ms=0.5")],
                 SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=1, max_repairs=1),
                 tmp_path / "t.jsonl")
    assert len(ev.evaluated) == 3 and res.best.median_ms == 0.5  # two answers and a repair, each built ahead
