"""The search loop against a table evaluator and scripted in-process proposers: beam, repairs, shares, budgets,
stopping, and replaying a trace without redoing finished work."""

from __future__ import annotations

import json
from collections.abc import Callable

import pytest

from runner.contract import Candidate, SearchBudget, Verdict
from runner.search.loop import search, shares
from runner.search.trace import read_events
from runner.search.types import Idea, ProblemContext, ProposerUnavailable, Session
from tests.fakes.evaluators import TableEvaluator

CTX = ProblemContext(name="relu", reference_source="class Model: ...", backend="cpu")


def cand(marker: str, salt: str = "") -> Candidate:
    return Candidate(id="x", format="fast", backend="cpu", sources={"kernel.cpp": f"// FAKE: {marker}\n// {salt}\n"})


class Scripted:
    """A proposer whose implementation of idea k (round r, impl j) is `impl(r, k, j)`; repairs via `fix`."""

    def __init__(self, name: str, impl: Callable[[int, int, int], str | None], fix: Callable[[Candidate], str | None]
                 = lambda c: None):
        self.name, self.impl, self.fix = name, impl, fix
        self.calls: list[str] = []
        self.session: Session | None = None

    def bind(self, session: Session) -> None:
        self.session = session

    def ideas(self, ctx, history, n):
        self.calls.append(f"ideas:{n}")
        r = len({i.round for i in history.ideas}) + 1
        return [Idea(text=f"{self.name} idea r{r}k{k}", round=r) for k in range(n)]

    def implement(self, ctx, idea, history, n):
        self.calls.append(f"implement:{idea.text}")
        out = []
        for j in range(n):
            marker = self.impl(idea.round, idea.index, j)
            if marker is None:
                self.session.failed(idea, "no code in the answer")
            else:
                out.append(cand(marker, f"{self.name} {idea.text} {j}"))
        return out

    def repair(self, ctx, candidate: Candidate, verdict: Verdict):
        self.calls.append(f"repair:{candidate.id}")
        marker = self.fix(candidate)
        return None if marker is None else cand(marker, "fixed " + candidate.sources["kernel.cpp"])


def test_shares_split_by_weight_and_sum_to_total():
    assert shares(4, [1, 1]) == [2, 2]
    assert shares(5, [3, 1, 1]) == [3, 1, 1]
    assert shares(3, [1, 1, 1, 1]) == [1, 1, 1, 0]
    assert sum(shares(7, [0.2, 0.5, 0.3])) == 7


def test_shares_rotate_so_every_model_gets_its_turns():
    given = [0, 0, 0]
    rounds = []
    for _ in range(3):
        k = shares(2, [1, 1, 1], given)
        rounds.append(k)
        given = [g + x for g, x in zip(given, k, strict=True)]
    assert rounds == [[1, 1, 0], [1, 0, 1], [0, 1, 1]] and given == [2, 2, 2]
    given = [0, 0]
    for _ in range(10):  # one branch a round, weights 3:1: 10 branches split 8:2 (Sainte-Lague), never starving b
        given = [g + x for g, x in zip(given, shares(1, [3, 1], given), strict=True)]
    assert given in ([8, 2], [7, 3]) and shares(3, [1, 0], [0, 0]) == [3, 0]


def test_a_third_model_runs_and_credit_per_model_reaches_the_result_and_trace(tmp_path):
    ps = [Scripted(n, lambda r, k, j, n=n: f"ms={ {'a': 0.5, 'b': 0.4, 'c': 0.3}[n] / r}") for n in "abc"]
    res = search(CTX, TableEvaluator(), ps, SearchBudget(rounds=3, ideas_per_round=2, implementations_per_idea=1),
                 tmp_path / "t.jsonl")
    assert all(p.calls.count("ideas:1") == 2 for p in ps)  # 3 rounds x 2 branches: two turns each
    credit = {c.name: c for c in res.credit}
    assert [credit[n].candidates for n in "abc"] == [2, 2, 2] and all(credit[n].verified == 2 for n in "abc")
    assert credit["c"].best and not credit["a"].best and sum(c.wins for c in res.credit) >= 3
    end = list(read_events(tmp_path / "t.jsonl"))[-1]
    assert [c["name"] for c in end["credit"]] == ["a", "b", "c"] and end["credit"][2]["best"] is True


def test_beam_holds_the_fastest_verified_and_the_search_stops_when_a_round_does_not_improve(tmp_path):
    # round 1: 2.0/1.0 ms and 0.5/3.0; round 2 improves to 0.25; round 3 offers nothing faster -> stop after 3
    times = {1: [0.5, 3.0], 2: [0.25, 0.6], 3: [0.9, 0.7], 4: [0.1, 0.1]}
    p = Scripted("a", lambda r, k, j: f"ms={times[r][j] + k}")
    ev = TableEvaluator()
    res = search(CTX, ev, [p], SearchBudget(rounds=4, ideas_per_round=2, implementations_per_idea=2, beam=2),
                 tmp_path / "trace.jsonl", chunk=4)
    assert res.stop_reason == "no improvement"
    assert res.rounds == 3
    assert [a.median_ms for a in res.beam] == [0.25, 0.5]
    assert res.best.candidate.id == "r2-a-i0-c0"
    assert len(ev.evaluated) == 12 and ev.batches == [4, 4, 4]
    assert res.progress.verified == 12 and res.progress.best_speedup == pytest.approx(0.8 / 0.25)
    events = [e["event"] for e in read_events(tmp_path / "trace.jsonl")]
    assert events[0] == "start" and events[-1] == "end" and events.count("evaluated") == 12
    assert events.count("round") == 3
    ev1 = TableEvaluator()  # one candidate at a time: each verdict reaches the trace before the next evaluation
    search(CTX, ev1, [p], SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=2), tmp_path / "1.jsonl",
           chunk=1)
    assert ev1.batches == [1, 1, 1, 1]


def test_a_rejected_candidate_goes_back_for_repair_up_to_max_repairs(tmp_path):
    # the first fix still fails to build, the second is wrong: with max_repairs=2 there is no third try
    fixes = iter(["build-error", "wrong", "ms=0.1"])
    p = Scripted("a", lambda r, k, j: "build-error", fix=lambda c: next(fixes))
    ev = TableEvaluator()
    res = search(CTX, ev, [p], SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1, max_repairs=2),
                 tmp_path / "t.jsonl")
    assert [c.id for c in ev.evaluated] == ["r1-a-i0-c0", "r1-a-i0-c0-fix1", "r1-a-i0-c0-fix2"]
    assert ev.evaluated[2].parent == "r1-a-i0-c0-fix1"
    assert res.best is None and res.progress.rejected == 3
    assert [a.verdict.stage for a in res.history.attempts] == ["build", "build", "verify"]

    fixes2 = iter(["ms=0.3"])
    p2 = Scripted("a", lambda r, k, j: "wrong", fix=lambda c: next(fixes2))
    res2 = search(CTX, TableEvaluator(), [p2], SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1),
                  tmp_path / "t2.jsonl")
    assert res2.best.candidate.id == "r1-a-i0-c0-fix1" and res2.best.repair_of == "r1-a-i0-c0"


def test_answers_without_code_are_failed_attempts_and_proposers_share_the_branches(tmp_path):
    a = Scripted("a", lambda r, k, j: None)
    b = Scripted("b", lambda r, k, j: f"ms={0.5 - 0.1 * r}")
    res = search(CTX, TableEvaluator(), [(a, 3), (b, 1)],
                 SearchBudget(rounds=2, ideas_per_round=4, implementations_per_idea=1), tmp_path / "t.jsonl")
    assert a.calls.count("ideas:3") == 2 and b.calls.count("ideas:1") == 2
    failures = [x for x in res.history.attempts if x.candidate is None]
    assert len(failures) == 6 and all(x.failure == "no code in the answer" and x.proposer == "a" for x in failures)
    assert res.best.proposer == "b" and res.best.median_ms == pytest.approx(0.3)


def test_candidates_budget_stops_before_exceeding(tmp_path):
    p = Scripted("a", lambda r, k, j: f"ms={1 + k + j / 10}")
    ev = TableEvaluator()
    res = search(CTX, ev, [p], SearchBudget(rounds=3, ideas_per_round=2, implementations_per_idea=2, candidates=5),
                 tmp_path / "t.jsonl")
    assert len(ev.evaluated) == 5 and res.candidates == 5
    assert res.stop_reason.startswith("budget: candidates")


def test_gpu_seconds_budget_counts_harness_seconds(tmp_path):
    p = Scripted("a", lambda r, k, j: f"ms={1.0 / r}")
    ev = TableEvaluator()  # 0.25 harness seconds per candidate
    res = search(CTX, ev, [p], SearchBudget(rounds=5, ideas_per_round=2, implementations_per_idea=1, gpu_seconds=1.0),
                 tmp_path / "t.jsonl")
    assert res.gpu_seconds == pytest.approx(1.0) and len(ev.evaluated) == 4
    assert res.stop_reason.startswith("budget: gpu")


def test_an_unavailable_proposer_leaves_and_the_others_go_on(tmp_path):
    class Down(Scripted):
        def ideas(self, ctx, history, n):
            raise ProposerUnavailable("endpoint down after 5 tries")

    res = search(CTX, TableEvaluator(), [Down("down", lambda r, k, j: None), Scripted("up", lambda r, k, j: "ms=0.4")],
                 SearchBudget(rounds=2, ideas_per_round=2, implementations_per_idea=1), tmp_path / "t.jsonl")
    assert res.best.proposer == "up"
    events = list(read_events(tmp_path / "t.jsonl"))
    assert [e["proposer"] for e in events if e["event"] == "unavailable"] == ["down"]


def test_a_search_run_again_on_its_trace_replays_it_without_evaluating_anything(tmp_path):
    trace = tmp_path / "t.jsonl"
    budget = SearchBudget(rounds=3, ideas_per_round=2, implementations_per_idea=2)
    impl = lambda r, k, j: "build-error" if j else f"ms={1.0 / r + k}"  # noqa: E731
    first = search(CTX, TableEvaluator(), [Scripted("a", impl, fix=lambda c: "wrong")], budget, trace)
    lines = trace.read_text().splitlines()
    # cut the trace after the 5th evaluated record, as a kill would (plus half a line)
    cut = [i for i, x in enumerate(lines) if json.loads(x)["event"] == "evaluated"][4]
    trace.write_text("\n".join(lines[: cut + 1]) + "\n" + lines[cut + 1][:20])
    ev = TableEvaluator()
    second = search(CTX, ev, [Scripted("a", impl, fix=lambda c: "wrong")], budget, trace)
    done_before = {json.loads(x)["candidate"]["id"] for x in lines[: cut + 1] if '"evaluated"' in x}
    assert len(done_before) == 5
    assert not done_before & {c.id for c in ev.evaluated}
    assert len(ev.evaluated) == first.candidates - 5
    assert [a.candidate.id for a in second.beam] == [a.candidate.id for a in first.beam]
    assert second.candidates == first.candidates and second.stop_reason == first.stop_reason


def test_time_budgets_are_checked_between_chunks_and_what_was_evaluated_is_kept(tmp_path):
    p = Scripted("a", lambda r, k, j: f"ms={1 + k + j / 10}")
    ev = TableEvaluator()  # 0.25 harness seconds per candidate
    res = search(CTX, ev, [p], SearchBudget(rounds=2, ideas_per_round=2, implementations_per_idea=2, gpu_seconds=0.5),
                 tmp_path / "t.jsonl", chunk=1)
    assert len(ev.evaluated) == 2 and len(res.history.attempts) == 2 and res.best.median_ms == 1.0
    assert res.stop_reason.startswith("budget: gpu")
    ev2 = TableEvaluator()
    res2 = search(CTX, ev2, [Scripted("a", lambda r, k, j: "ms=1")], SearchBudget(wall_seconds=0.0),
                  tmp_path / "w.jsonl")
    assert ev2.evaluated == [] and res2.stop_reason.startswith("budget: wall") and res2.best is None


def test_chunks_shrink_to_what_the_remaining_wall_budget_holds(tmp_path):
    """After the first chunk, the seconds per candidate seen so far size the next chunk: 0.3 s a candidate and a 1 s
    budget evaluate 2 in the first chunk (its size is fixed before anything is known), then 1 more, not 2."""
    p = Scripted("a", lambda r, k, j: f"ms={1 + k + j / 10}")
    ev = TableEvaluator(delay_s=0.3)
    res = search(CTX, ev, [p], SearchBudget(rounds=1, ideas_per_round=3, implementations_per_idea=2, wall_seconds=1.0),
                 tmp_path / "t.jsonl", chunk=2)
    assert ev.batches[:2] == [2, 1], ev.batches
    assert res.stop_reason.startswith("budget: wall")


def _killed_after_spending_the_wall_budget(trace, budget, impl) -> list[dict]:
    """Run the search, then cut its trace after round 1's verdicts with the clock at the wall budget: a run killed
    once its budget was spent, before its round and end records. Returns the evaluated records kept."""
    search(CTX, TableEvaluator(), [Scripted("a", impl)], budget, trace)
    events = list(read_events(trace))
    kept = events[: max(i for i, e in enumerate(events) if e["event"] == "evaluated" and e["round"] == 1) + 1]
    kept[-1]["t_s"] = budget.wall_seconds
    trace.write_text("".join(json.dumps(e) + "\n" for e in kept))
    return [e for e in kept if e["event"] == "evaluated"]


def test_a_resumed_search_whose_wall_budget_is_spent_still_reports_the_best_verified_kernel_of_its_trace(tmp_path):
    trace = tmp_path / "t.jsonl"
    budget = SearchBudget(rounds=2, ideas_per_round=2, implementations_per_idea=2, wall_seconds=60.0)
    impl = lambda r, k, j: "wrong" if j else f"ms={0.5 / r + k}"  # noqa: E731
    evaluated = _killed_after_spending_the_wall_budget(trace, budget, impl)
    assert len(evaluated) == 4
    ev = TableEvaluator()
    res = search(CTX, ev, [Scripted("a", impl)], budget, trace)
    assert ev.evaluated == [] and res.stop_reason.startswith("budget: wall")
    assert res.best is not None and res.best.candidate.id == "r1-a-i0-c0" and res.best.median_ms == 0.5
    assert res.best.proposer == "a" and res.best.round == 1 and res.best.idea == "a idea r1k0"
    assert [a.median_ms for a in res.beam] == [0.5, 1.5]
    assert res.candidates == 4 and (res.progress.verified, res.progress.rejected) == (2, 2)
    assert res.progress.best_speedup == pytest.approx(0.8 / 0.5)
    end = list(read_events(trace))[-1]
    assert end["event"] == "end" and end["best"] == "r1-a-i0-c0" and end["candidates"] == 4


def test_a_kernel_from_a_resumed_trace_is_confirmed_like_a_fresh_one_before_it_is_proposed(tmp_path):
    """The resumed search's best goes through the caller's confirmation: re-timed against the baselines, it is
    proposed only if it wins every round, and a kernel that fails when verified again is not proposed."""
    from runner.contract import Confirmation, Environment, ProblemSpec
    from runner.pipeline import optimize_problem

    class Confirming(TableEvaluator):
        def __init__(self, wins: bool):
            super().__init__()
            self.wins, self.confirmed = wins, []

        def reference_source(self):
            return CTX.reference_source

        def roofline(self):
            return None

        def environment(self):
            return Environment(device="cpu", torch="x", python="x", fusebot="x")

        def confirm(self, candidate, rounds=5):
            self.confirmed.append(candidate.id)
            v = self.evaluate(candidate)
            if not self.wins:
                return v.model_copy(update={"accepted": False, "stage": "verify", "reasons": ["mismatch: again"]})
            ms = v.timing.median_ms
            c = Confirmation(rounds=rounds, candidate_ms=[ms] * rounds, eager_ms=[1.0] * rounds,
                             compile_ms=[0.8] * rounds, speedup_vs_eager=[1.0 / ms] * rounds,
                             speedup_vs_compile=[0.8 / ms] * rounds)
            return v.model_copy(update={"confirmation": c})

    spec = ProblemSpec(name="relu", path=None, module="m")
    budget = SearchBudget(rounds=2, ideas_per_round=1, implementations_per_idea=1, wall_seconds=60.0)
    impl = lambda r, k, j: f"ms={0.5 / r}"  # noqa: E731
    for wins in (True, False):
        out = tmp_path / str(wins)
        _killed_after_spending_the_wall_budget(out / "trace.jsonl", budget, impl)
        ev = Confirming(wins)
        o = optimize_problem(spec, out, budget, [Scripted("a", impl)], ev, "cpu")
        assert ev.confirmed == ["r1-a-i0-c0"] and [c.id for c in ev.evaluated] == ["r1-a-i0-c0"]
        assert o.improved is wins and o.best.candidate.id == "r1-a-i0-c0", o.message
        assert (out / "kernel.cpp").exists() is wins


def test_a_candidate_gets_five_tries_by_default():
    # the answer and four repairs, each fed with the chain of attempts
    assert SearchBudget().max_repairs == 4
