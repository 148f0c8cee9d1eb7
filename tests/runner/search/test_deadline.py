"""A budget that binds the whole target: the split, the search's cut-off of a chunk in evaluation, a cancel, the
confirmation's rounds reported as they end and stopped when the next would not fit, and budgets of zero or less
refused. Every time here is a fake clock's: nothing depends on how fast this machine runs."""

from __future__ import annotations

import threading
import time

import pytest
from typer.testing import CliRunner

from bot.repo.config import FusebotConfig
from runner.cli.bench import bench_app
from runner.cli.optimize import optimize_app
from runner.contract import (
    CUT_OFF,
    Candidate,
    Confirmation,
    Environment,
    ProblemSpec,
    Progress,
    Roofline,
    SearchBudget,
    Verdict,
)
from runner.pipeline import optimize_problem
from runner.results.choice import confirm_finalists
from runner.search.cutoff import within
from runner.search.deadline import (
    STARTUP_MAX_S,
    Cancelled,
    Deadline,
    exit_reserve_s,
    plan_split,
    process_start_s,
    refuse_budget,
)
from runner.search.loop import search
from runner.search.types import BudgetExhausted, ProblemContext
from tests.fakes.evaluators import TableEvaluator
from tests.runner.results.test_choice import attempt, confirmed, search_result
from tests.runner.search.test_loop import Scripted

CTX = ProblemContext(name="relu", reference_source="class Model: ...", backend="cpu")


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


class Timed(TableEvaluator):
    """Each candidate costs `per_candidate_s` on the fake clock; confirmation rounds cost `per_round_s` each."""

    def __init__(self, clock: Clock, per_candidate_s: float, per_round_s: float = 0.0, setup_s: float = 0.0):
        super().__init__()
        self.clock, self.per_candidate_s, self.per_round_s, self.setup_s = clock, per_candidate_s, per_round_s, setup_s
        self.rounds_run: list[int] = []

    def evaluate(self, candidate: Candidate) -> Verdict:
        self.clock.t += self.per_candidate_s
        return super().evaluate(candidate)

    def reference_source(self) -> str:
        self.clock.t += self.setup_s
        return CTX.reference_source

    def roofline(self):
        return None

    def environment(self):
        return Environment(device="cpu", torch="x", python="x", fusebot="x")

    def confirm(self, candidate, rounds=5, on_round=None):
        v = super().evaluate(candidate)
        ms = v.timing.median_ms
        done = 0
        for n in range(1, rounds + 1):
            self.clock.t += self.per_round_s
            done = n
            if on_round is not None and not on_round(n, ms, 1.0, 0.8):
                break
        self.rounds_run.append(done)
        c = Confirmation(rounds=done, candidate_ms=[ms] * done, eager_ms=[1.0] * done, compile_ms=[0.8] * done,
                         speedup_vs_eager=[1.0 / ms] * done, speedup_vs_compile=[0.8 / ms] * done)
        return v.model_copy(update={"confirmation": c})


def test_the_split_gives_the_confirmation_its_share_and_says_so():
    s = plan_split(60.0)
    assert (s.search_end_s, s.confirm_s) == (51.0, 9.0)
    assert s.announce() == ("budget 60 s for the whole run: capture and baselines, then the search until 51 s, then "
                            "the confirmation of the finalists (9 s)")


@pytest.mark.parametrize("seconds", [0.0, -5.0, float("nan")])
def test_budgets_of_zero_or_less_are_refused(seconds):
    assert "--wall-seconds must be more than 0 seconds" in refuse_budget(seconds, "--wall-seconds")


def test_a_positive_budget_is_not_refused():
    assert refuse_budget(0.5, "--wall-seconds") is None


def test_the_search_ends_at_its_deadline_on_a_fake_clock(tmp_path):
    clock = Clock()
    ev = Timed(clock, per_candidate_s=3.0)
    deadline = Deadline(1000.0, clock).until(20.0)  # (the confirmation's share, 980 s, needs nothing of it)
    budget = SearchBudget(rounds=3, ideas_per_round=4, implementations_per_idea=2, wall_seconds=1e6)
    res = search(CTX, ev, [Scripted("a", lambda r, k, j: f"ms={1 + k + j / 10 - r / 10}")], budget,
                 tmp_path / "t.jsonl", chunk=1, deadline=deadline)
    assert res.stop_reason.startswith("budget: wall") and "share of the budget" in res.stop_reason
    assert deadline.elapsed_s() <= 20.0 + 3.0  # at most the chunk in flight when it ran out (one candidate)
    assert len(ev.evaluated) == 7


class Blocking(TableEvaluator):
    """The second chunk runs past the deadline and would never finish: only `abort()` ends it."""

    def __init__(self, clock: Clock, deadline_s: float, finish_first: int = 0):
        super().__init__()
        self.clock, self.deadline_s, self.finish_first = clock, deadline_s, finish_first
        self.aborted = threading.Event()
        self.calls = 0

    def evaluate_many(self, candidates):
        self.calls += 1
        if self.calls == 1:
            return super().evaluate_many(candidates)
        done = [self.evaluate(c) for c in candidates[: self.finish_first]]  # evaluated in full before the cut
        self.clock.t += self.deadline_s  # the budget runs out while the rest of this chunk is being verified
        assert self.aborted.wait(30), "the search never aborted the chunk it cut off"
        rest = candidates[self.finish_first:]
        return done + [Verdict(candidate_id=c.id, problem="fake", accepted=False, reasons=[CUT_OFF]) for c in rest]

    def abort(self) -> None:
        self.aborted.set()


def test_a_chunk_still_in_evaluation_when_the_budget_runs_out_is_cut_off_not_waited_for(tmp_path):
    clock = Clock()
    ev = Blocking(clock, 100.0)
    budget = SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=2, wall_seconds=1e6)
    res = search(CTX, ev, [Scripted("a", lambda r, k, j: f"ms={1 + k + j}")], budget, tmp_path / "t.jsonl",
                 chunk=2, deadline=Deadline(50.0, clock))
    assert ev.aborted.is_set() and ev.calls == 2
    assert "cut off" in res.stop_reason
    # the cut-off chunk's candidates are not archived (a resumed search evaluates them again)
    assert len(res.history.attempts) == 2 and res.candidates == 2


def test_what_a_cut_off_chunk_finished_before_the_cut_is_archived_and_traced(tmp_path):
    """A chunk of two on one GPU: the first candidate's verdict is in when the budget runs out during the second's
    evaluation. The first is archived (and in the trace, so a resume does not redo it); the second is dropped."""
    clock = Clock()
    ev = Blocking(clock, 100.0, finish_first=1)
    budget = SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=2, wall_seconds=1e6)
    res = search(CTX, ev, [Scripted("a", lambda r, k, j: f"ms={1 + k + j}")], budget, tmp_path / "t.jsonl",
                 chunk=2, deadline=Deadline(50.0, clock))
    assert ev.aborted.is_set() and ev.calls == 2
    assert "1 candidate(s) in evaluation cut off" in res.stop_reason, res.stop_reason
    third = ev.evaluated[2].id
    assert len(res.history.attempts) == 3 and res.candidates == 3
    assert third in [a.candidate.id for a in res.history.attempts]
    traced = [line for line in (tmp_path / "t.jsonl").read_text().splitlines() if '"evaluated"' in line]
    assert len(traced) == 3 and all("cut off" not in line for line in traced)


def test_a_cancel_stops_the_search_and_no_proposer_is_called_after_it(tmp_path):
    clock = Clock()
    deadline = Deadline(1e6, clock)
    calls_after: list[str] = []

    class Cancelling(TableEvaluator):
        def evaluate_many(self, candidates):
            deadline.cancel.set()  # /fusebot stop arrives while the first chunk is evaluated
            return super().evaluate_many(candidates)

    p = Scripted("a", lambda r, k, j: "wrong", fix=lambda c: "ms=1")
    original = p.repair

    def repair(*args):
        calls_after.append("repair")
        return original(*args)

    p.repair = repair
    budget = SearchBudget(rounds=3, ideas_per_round=1, implementations_per_idea=1, wall_seconds=1e6)
    with pytest.raises(Cancelled):
        search(CTX, Cancelling(), [p], budget, tmp_path / "t.jsonl", chunk=1, deadline=deadline)
    assert calls_after == [] and p.calls == ["ideas:1", "implement:a idea r1k0"]


def test_optimize_ends_within_its_budget_and_the_confirmation_reports_its_rounds(tmp_path):
    clock = Clock()
    ev = Timed(clock, per_candidate_s=4.0, per_round_s=3.0, setup_s=6.0)
    seen: list[Progress] = []
    budget = SearchBudget(rounds=3, ideas_per_round=2, implementations_per_idea=2, wall_seconds=60.0)
    deadline = Deadline(60.0, clock)
    o = optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path, budget,
                         [Scripted("a", lambda r, k, j: f"ms={0.5 - r / 100 - k / 1000 - j / 10000}")], ev, "cpu",
                         progress=seen.append, deadline=deadline, confirm_rounds=5)
    assert deadline.elapsed_s() <= 60.0 * 1.1, deadline.elapsed_s()
    messages = [p.message for p in seen]
    assert messages[0].startswith("budget 60 s for the whole run") and "until 51 s" in messages[0]
    rounds = [m for m in messages if m.startswith("confirming the best kernel: round")]
    assert rounds and rounds[0].startswith("confirming the best kernel: round 1/5: ")
    assert ev.rounds_run == [len(rounds)] and 1 <= len(rounds) < 5  # stopped when the next would not fit
    assert o.best is not None and o.best.candidate.id.startswith("r")


def test_the_finalists_are_confirmed_in_the_rounds_the_host_sets(tmp_path, monkeypatch):
    budget = SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1, wall_seconds=600.0)
    proposers = [Scripted("a", lambda r, k, j: "ms=0.5")]
    for setting, rounds in (("", 5), ("3", 3)):
        monkeypatch.setenv("FUSEBOT_CONFIRM_ROUNDS", setting)
        ev = Timed(Clock(), per_candidate_s=1.0)
        optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path / f"r{rounds}", budget, proposers, ev, "cpu",
                         deadline=Deadline(600.0, ev.clock))
        assert ev.rounds_run == [rounds]
    ev = Timed(Clock(), per_candidate_s=1.0)
    optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path / "own", budget, proposers, ev, "cpu",
                     deadline=Deadline(600.0, ev.clock), confirm_rounds=4)  # a caller's own number wins
    assert ev.rounds_run == [4]
    monkeypatch.setenv("FUSEBOT_CONFIRM_ROUNDS", "1")
    ev = Timed(Clock(), per_candidate_s=1.0)
    with pytest.raises(ValueError, match="FUSEBOT_CONFIRM_ROUNDS must be a whole number of rounds, at least 2"):
        optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path / "bad", budget, proposers, ev, "cpu",
                         deadline=Deadline(600.0, ev.clock))
    assert ev.evaluated == [] and not (tmp_path / "bad").exists()  # refused before anything started


def test_the_cli_refuses_a_budget_of_zero_with_exit_2():
    r = CliRunner().invoke(optimize_app, ["examples/row_gain.py", "--out", "/nonexistent/x", "--wall-seconds", "0"])
    assert r.exit_code == 2 and "--wall-seconds must be more than 0 seconds" in r.output
    r = CliRunner().invoke(bench_app, ["bench/suites", "--out", "/nonexistent/x", "--budget-seconds", "-1"])
    assert r.exit_code == 2 and "--budget-seconds must be more than 0 seconds" in r.output


def test_the_help_says_what_the_budget_bounds():
    r = CliRunner().invoke(optimize_app, ["-h"], terminal_width=200)
    text = " ".join(r.output.split())
    assert "Budget for the whole command, from its start to its exit, in seconds: capture and baselines, the search, " \
           "the confirmation of its finalists and writing DIR all end within it." in text, text
    assert "wall-clock seconds" not in text
    r = CliRunner().invoke(bench_app, ["-h"], terminal_width=200)
    text = " ".join(r.output.split())
    assert "Budget per problem, in seconds from its start to its result folder" in text, text


def test_the_config_refuses_a_budget_of_zero():
    with pytest.raises(ValueError, match="wall_seconds must be more than 0"):
        FusebotConfig.model_validate({"budget": {"wall_seconds": 0}})


def test_the_round_shows_as_it_starts_not_after_its_first_chunk(tmp_path):
    seen: list[Progress] = []

    class Watching(TableEvaluator):
        def evaluate_many(self, candidates):
            seen.append(Progress(message="evaluating"))
            return super().evaluate_many(candidates)

    search(CTX, Watching(), [Scripted("a", lambda r, k, j: "ms=1")], SearchBudget(rounds=1, ideas_per_round=1,
           implementations_per_idea=1), tmp_path / "t.jsonl", progress=seen.append)
    first = next(i for i, p in enumerate(seen) if p.message == "evaluating")
    assert any(p.round == 1 for p in seen[:first]), seen


def test_the_search_leaves_the_confirmation_the_time_its_candidates_say_it_needs(tmp_path):
    # 10 s a candidate: confirming the finalists needs about 20 s, more than the 15 s share left after the search
    clock = Clock()
    ev = Timed(clock, per_candidate_s=10.0)
    deadline = Deadline(100.0, clock).until(85.0)
    assert deadline.after_s == 15.0
    budget = SearchBudget(rounds=3, ideas_per_round=4, implementations_per_idea=2, wall_seconds=1e6)
    res = search(CTX, ev, [Scripted("a", lambda r, k, j: f"ms={1 + k + j / 10 - r / 10}")], budget,
                 tmp_path / "t.jsonl", chunk=1, deadline=deadline)
    assert len(ev.evaluated) == 8 and "what confirming the finalists takes" in res.stop_reason


def test_the_faster_finalist_is_confirmed_first_and_the_slower_one_only_if_its_time_is_left():
    clock = Clock()
    asked: list[str] = []

    class Ev:
        def confirm(self, candidate, rounds=5, on_round=None):
            asked.append(candidate.id)
            for n in range(1, rounds + 1):
                clock.t += 4.0
                if not on_round(n, 1.0, 2.0, 1.5):
                    break
            return confirmed([1.0] * n, [1.5] * n)

    kernel, rewrite = attempt("k", 1.0), attempt("w", 0.5, rewrite="new module")
    deadline = Deadline(20.0, clock)  # the rewrite's share: 10 s, two rounds of 4 s and then no third
    kv, wv = confirm_finalists(search_result(kernel, rewrite), Ev(), 5, deadline=deadline)
    assert asked == ["w", "k"] and wv.confirmation.rounds == 2 and kv is not None
    asked.clear()
    short = Deadline(9.0, clock)  # the rewrite's two rounds (the least) take 8 s: 1 s is left, the kernel is skipped
    kv, wv = confirm_finalists(search_result(kernel, rewrite), Ev(), 5, deadline=short)
    assert asked == ["w"] and kv is None and wv.confirmation.rounds == 2


class Stalling(Timed):
    """A judge whose step `stage` ("reference" or "baselines") takes `stall_s` on the fake clock and then never ends
    by itself: it waits until `stop()` kills it (as Evaluator.stop kills the judge)."""

    def __init__(self, clock: Clock, stage: str, stall_s: float):
        super().__init__(clock, per_candidate_s=1.0)
        self.stage, self.stall_s = stage, stall_s
        self.killed = threading.Event()

    def _stall(self) -> None:
        self.clock.t += self.stall_s
        assert self.killed.wait(30), "the step was never cut off"
        raise RuntimeError("the judge was killed")

    def reference_source(self) -> str:
        if self.stage == "reference":
            self._stall()
        return super().reference_source()

    def roofline(self):
        return Roofline(bytes_moved=4 << 20, bandwidth_bytes_per_s=1e9, floor_ms=4.2, bandwidth_source="given")

    def baselines(self):
        if self.stage == "baselines":
            self._stall()
        return super().baselines()

    def stop(self) -> None:
        self.killed.set()


@pytest.mark.parametrize(("stage", "said"), [("reference", "starting the reference"),
                                              ("baselines", "timing the baselines")])
def test_a_setup_step_still_running_when_the_search_share_ends_is_cut_off_and_said(tmp_path, stage, said):
    clock = Clock()
    ev = Stalling(clock, stage, stall_s=40.0)
    deadline = Deadline(30.0, clock)
    p = Scripted("a", lambda r, k, j: "ms=1")
    o = optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path, SearchBudget(wall_seconds=30.0), [p], ev,
                         "cpu", deadline=deadline, reserve_s=1.5, skips=lambda ctx: False)
    assert ev.killed.is_set() and p.calls == [] and ev.evaluated == []
    assert o.message.startswith(f"the budget ran out while {said} (40 s of 30 s): no search was run"), o.message
    assert not o.improved and (tmp_path / "result.json").exists() and "no search was run" in \
        (tmp_path / "report.md").read_text()


def test_a_cancel_during_the_setup_kills_the_judge_and_raises(tmp_path):
    clock = Clock()

    class CancelledInStart(Stalling):
        def _stall(self) -> None:
            deadline.cancel.set()  # /fusebot stop while the judge starts
            super()._stall()

    ev = CancelledInStart(clock, "reference", stall_s=0.0)
    deadline = Deadline(1e6, clock)
    with pytest.raises(Cancelled):
        optimize_problem(ProblemSpec(name="relu", module="m"), tmp_path, SearchBudget(), [], ev, "cpu",
                         deadline=deadline)
    assert ev.killed.is_set()


def test_the_split_keeps_the_reserve_for_the_exit_and_says_so():
    s = plan_split(30.0, reserve_s=exit_reserve_s(30.0))
    assert (s.search_end_s, s.work_end_s, s.reserve_s) == (pytest.approx(24.225), 28.5, 1.5)
    assert s.announce().endswith("then the confirmation of the finalists (4 s), then 1.5 s to write the results and "
                                 "exit")


def test_within_returns_the_steps_value_or_cuts_it_off_at_the_deadline():
    clock = Clock()
    assert within(Deadline(10.0, clock), lambda: 7, "adding") == 7
    release = threading.Event()

    def slow() -> int:
        clock.t += 11.0
        release.wait(30)
        return 1

    try:
        with pytest.raises(BudgetExhausted, match="cut off while adding"):
            within(Deadline(10.0, clock), slow, "adding")
    finally:
        release.set()
    with pytest.raises(ZeroDivisionError):
        within(Deadline(10.0, clock), lambda: 1 / 0, "dividing")


def test_a_commands_budget_starts_when_its_process_started():
    clock = Clock()
    assert process_start_s(clock, age_s=7.5) == clock.t - 7.5  # its interpreter's start and imports count
    assert process_start_s(clock, age_s=-1.0) == clock.t  # a clock that disagrees: now
    # a process older than any start-up (a test runner calling the command in-process): the budget starts at the call
    assert process_start_s(clock, age_s=STARTUP_MAX_S + 1) == clock.t
    import psutil

    age_s = time.time() - psutil.Process().create_time()
    start = process_start_s(clock)
    assert start <= clock.t - age_s + 1e-6 if age_s <= STARTUP_MAX_S else start == clock.t
