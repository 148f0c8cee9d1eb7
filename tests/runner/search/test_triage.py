"""Triage: no search where the faster baseline already runs within the minimum effect of the memory floor and no
work can be skipped; the outcome says so with the figure. Baselines and floors are injected."""

from __future__ import annotations

import json

from runner.contract import Baselines, ProblemSpec, Roofline, SearchBudget
from runner.pipeline import optimize_problem
from runner.search.triage import at_floor
from tests.fakes.evaluators import TableEvaluator, timing


def roof(floor_ms: float) -> Roofline:
    return Roofline(bytes_moved=850_000_000, bandwidth_bytes_per_s=4.25e12, bandwidth_source="measured copy",
                    floor_ms=floor_ms)


def test_a_baseline_within_the_minimum_effect_of_the_floor_is_not_searched():
    base = Baselines(eager=timing(0.40), compile=timing(0.204))
    why = at_floor(base, roof(0.2), skips=False)
    assert why is not None and why.startswith("torch.compile runs at 98% of the memory floor (0.204 ms against 0.2 ms")
    assert "minimum effect (3%)" in why
    assert at_floor(base, roof(0.2), skips=True) is None  # a mask's elements skipped move fewer bytes than the floor
    assert at_floor(base, roof(0.19), skips=False) is None  # 93%: room for a kernel 3% faster
    assert at_floor(Baselines(eager=timing(0.2), compile=None), roof(0.2), skips=False).startswith("eager runs at 100%")
    assert at_floor(base, None, skips=False) is None and at_floor(Baselines(), roof(0.2), skips=False) is None


class AtFloor(TableEvaluator):
    """A harness whose torch.compile runs at 99% of the floor (the baselines and roofline the search would see)."""

    def reference_source(self):
        return "class Model: ...\n"

    def roofline(self):
        return roof(0.198)

    def environment(self, confinement=None):
        from runner.contract import Environment

        return Environment(device="cpu", cpu="fake", torch="2", python="3", fusebot="0")


class NeverCalled:
    name = "never"

    def bind(self, session):
        pass

    def ideas(self, ctx, history, n):
        raise AssertionError("the search ran")


def test_optimize_spends_no_search_at_the_floor_and_says_why(tmp_path):
    ev = AtFloor(eager_ms=0.5, compile_ms=0.2)
    spec = ProblemSpec(name="norm", path=str(tmp_path / "norm.py"))
    o = optimize_problem(spec, tmp_path / "out", SearchBudget(rounds=3), [(NeverCalled(), 1.0)], ev, "cpu",
                         skips=lambda ctx: False)
    assert not o.improved and o.candidates == 0 and o.stop_reason == "at-floor" and not ev.evaluated
    assert o.message.startswith("torch.compile runs at 99% of the memory floor (0.2 ms against 0.198 ms")
    assert json.loads((tmp_path / "out/result.json").read_text())["message"] == o.message
    assert o.message in (tmp_path / "out/report.md").read_text()
    skipped = optimize_problem(spec, tmp_path / "out2", SearchBudget(rounds=1), [], ev, "cpu", skips=lambda ctx: True)
    assert skipped.stop_reason != "at-floor"  # a causal mask's triangle: searched
