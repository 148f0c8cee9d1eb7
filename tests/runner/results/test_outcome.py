"""report.md and result.json as pure functions of a search result: the decision, the table, the trace."""

from __future__ import annotations

import json

from runner.contract import CUT_OFF, Baselines, Candidate, Roofline, TrialResult, Verdict
from runner.results.outcome import benchmark_table, outcome, report_markdown, result_json
from runner.search.loop import SearchResult
from runner.search.types import Attempt, History, Idea
from tests.fakes.evaluators import timing

ROOF = Roofline(bytes_moved=8 << 20, bandwidth_bytes_per_s=2e10, bandwidth_source="measured", floor_ms=0.4)


def result(*attempts: Attempt) -> SearchResult:
    h = History(attempts=list(attempts), ideas=[Idea(text=a.idea, round=a.round, proposer="m") for a in attempts])
    beam = sorted((a for a in attempts if a.accepted), key=lambda a: a.median_ms)
    return SearchResult(history=h, beam=beam, stop_reason="no improvement", rounds=2, tokens_used=1234,
                        cost_usd=0.5, gpu_seconds=3.0, wall_seconds=9.0, candidates=len(attempts))


def att(ms: float | None, rnd: int = 1, reasons: list[str] | None = None, **vk) -> Attempt:
    c = Candidate(id=f"r{rnd}-m-{ms}", format="fast", backend="cpu", sources={"kernel.cpp": "//"})
    v = Verdict(candidate_id=c.id, problem="p", accepted=ms is not None, timing=timing(ms) if ms else None,
                stage="done" if ms else "verify", reasons=reasons or [], **vk)
    return Attempt(round=rnd, proposer="m", idea=f"idea {ms}", candidate=c, verdict=v)


def test_a_kernel_faster_than_both_baselines_is_an_improvement_with_a_full_table():
    o = outcome("p", result(att(0.5), att(None, reasons=["mismatch: a|b"])), Baselines(eager=timing(2.0),
                compile=timing(1.0)), ROOF)
    assert o.improved and o.message == "0.5 ms, 2.00x faster than torch.compile (1 ms)"
    table = benchmark_table(o)
    assert "| PyTorch eager | 2 | 0.04 | 10 | 1.00x | 0.50x | 20.00% |" in table
    assert "| fusebot (r1-m-0.5) | 0.5 | 0.01 | 10 | 4.00x | 2.00x | 80.00% |" in table
    assert "| roofline floor | 0.4 |" in table
    md = report_markdown(o)
    assert md.startswith("# fusebot: p\n\n**Improved**: 0.5 ms")
    assert "mismatch: a\\|b" in md and "rejected at verify" in md and "1234 tokens, $0.50" in md
    assert "stopped: no improvement" in md and "### Round 1" in md and "- (m) idea 0.5" in md


def test_nothing_faster_than_the_faster_baseline_is_no_improvement():
    o = outcome("p", result(att(1.5), att(1.2, rnd=2)), Baselines(eager=timing(2.0), compile=timing(1.0)), ROOF)
    assert not o.improved and o.best.median_ms == 1.2
    assert o.message == "nothing beat torch.compile (1 ms): the fastest verified kernel took 1.2 ms; no kernel is " \
                        "proposed"
    assert "**No improvement**: nothing beat torch.compile" in report_markdown(o)
    o2 = outcome("p", result(att(None, reasons=["build: x"])), Baselines(eager=timing(2.0)), None)
    assert not o2.improved and o2.message == "no candidate was verified (1 evaluated: 1 build; the first: build: x): " \
                                             "no kernel is proposed", o2.message
    assert "| torch.compile | n/a |" in benchmark_table(o2)


def test_candidates_cut_off_by_the_budget_say_so_and_not_how_their_killed_process_died():
    killed = ["crash: process died during 'trial' (SIGKILL) --- last output --- a profiler warning", CUT_OFF]
    o = outcome("p", result(att(None, reasons=killed), att(None, rnd=2, reasons=["build: x"])),
                Baselines(eager=timing(2.0)), None)
    assert not o.improved and o.message.startswith("the budget ran out before any candidate was verified (1 cut off "
                                                   "during their evaluation): no kernel is proposed"), o.message
    md = report_markdown(o)
    assert f"| rejected at verify | {CUT_OFF} |" in md and "SIGKILL" not in md
    assert "| build: x |" in md


def test_the_host_time_per_call_is_shown_apart_and_said_to_be_outside_the_gpu_times():
    gpu = lambda ms, host: timing(ms).model_copy(update={"host_ms": host, "lead_ms": 1.5 * host})  # noqa: E731
    o = outcome("p", result(att(0.5)), Baselines(eager=gpu(2.0, 0.031), compile=gpu(1.0, 0.205)), ROOF)
    table = benchmark_table(o)
    assert table.splitlines()[0].endswith("| % of floor | host us per call |")
    assert "| PyTorch eager | 2 | 0.04 | 10 | 1.00x | 0.50x | 20.00% | 31 |" in table
    assert "| torch.compile | 1 | 0.02 | 10 | 2.00x | 1.00x | 40.00% | 205 |" in table
    assert "| fusebot (r1-m-0.5) | 0.5 | 0.01 | 10 | 4.00x | 2.00x | 80.00% | n/a |" in table  # (not recorded)
    assert gpu(1.0, 0.2).lead_text().startswith("each call's host work") and timing(1.0).lead_text() == ""


def test_a_degenerate_problem_never_reports_a_speedup():
    o = outcome("p", result(att(0.1, degenerate=True)), Baselines(eager=timing(2.0)), ROOF)
    assert not o.improved and "degenerate" in o.message


def test_result_json_summarises_the_trace_and_is_json():
    no_code = Attempt(round=1, proposer="m", idea="x", failure="no code")
    o = outcome("p", result(att(0.5), att(None, reasons=["build: e"]), no_code), Baselines(eager=timing(2.0)), ROOF)
    r = json.loads(json.dumps(result_json(o, ["kernel.cpp"])))
    assert r["improved"] and r["verdict"]["timing"]["median_ms"] == 0.5 and r["files"] == ["kernel.cpp"]
    s = r["trace_summary"]
    assert (s["accepted"], s["rejected"], s["no_code"], s["attempts"]) == (1, 1, 1, 3)
    assert (s["tokens_used"], s["best"], s["stop_reason"]) == (1234, "r1-m-0.5", "no improvement")


def _confirmed(cand_ms: list[float], eager_ms: list[float]):
    from runner.contract import Confirmation
    from runner.harness.timing import summarize

    t = lambda xs: summarize(xs, clock="cuda_events", l2_flushed=True)  # noqa: E731
    conf = Confirmation(rounds=len(cand_ms), candidate_ms=cand_ms, eager_ms=eager_ms,
                        speedup_vs_eager=[e / c for e, c in zip(eager_ms, cand_ms, strict=True)])
    return Verdict(candidate_id="c", problem="p", accepted=True, timing=t(cand_ms),
                   baselines=Baselines(eager=t(eager_ms)), confirmation=conf)


def test_a_confirmed_win_must_hold_in_every_round():
    best = Attempt(round=1, proposer="x", idea="i", candidate=None, verdict=None)
    result = SearchResult(history=History(), beam=[best], stop_reason="rounds", rounds=1, tokens_used=0, cost_usd=0.0,
                          gpu_seconds=0.0, wall_seconds=0.0, candidates=1)
    wins = outcome("p", result, None, None, confirmed=_confirmed([1.0, 1.0, 1.0], [1.2, 1.3, 1.1]))
    assert wins.improved and "1.10-1.30x over 3 alternating rounds" in wins.message
    searched = Attempt(round=1, proposer="x", idea="i", candidate=None,
                       verdict=Verdict(candidate_id="c", problem="p", accepted=True,
                                       trials=[TrialResult(index=i, shape_set=i // 5, distribution="factory", passed=True)
                                               for i in range(7)]))
    result.beam = [searched]
    confirmed = _confirmed([1.0, 1.0], [1.2, 1.3])
    confirmed.trials = [TrialResult(index=0, shape_set=0, distribution="factory", passed=True)]
    both = outcome("p", result, None, None, confirmed=confirmed)
    assert len(both.verdict.trials) == 8  # the search's seven, then the confirmation's one
    loses_once = outcome("p", result, None, None, confirmed=_confirmed([1.0, 1.0, 1.0], [1.2, 0.95, 1.3]))
    assert not loses_once.improved and loses_once.message.startswith("nothing beat eager in every round")


def test_where_no_candidate_is_verified_the_message_names_the_commonest_reason_in_full():
    long = "mismatch: output 0: " + "x" * 400
    o = outcome("p", result(att(None, reasons=[long]), att(None, reasons=["crash: died\n  during 'trial'"]),
                            att(None, rnd=2, reasons=["mismatch: output 0: y"])), Baselines(eager=timing(2.0)), None)
    assert o.message.startswith("no candidate was verified (3 evaluated: 2 mismatch, 1 crash; one: mismatch: output 0: "
                                "xxx"), o.message
    assert "…): no kernel is proposed" in o.message and len(o.message) < 340
    o2 = outcome("p", result(), Baselines(eager=timing(2.0)), None)
    assert o2.message == "no candidate was verified (none was evaluated): no kernel is proposed"
