"""What a search proposes: the minimum effect on both sides of its margin, and the PyTorch rewrite against the best
kernel (within 10%, or not slower in every round: the rewrite; clearly slower: the kernel)."""

from __future__ import annotations

import pytest

from runner.contract import Baselines, BuildInfo, Candidate, Confirmation, KernelResources, Roofline, Verdict
from runner.harness.confirm import MIN_EFFECT, margin, spread, won_every_round
from runner.harness.timing import summarize
from runner.results.choice import choose, claim, confirm_finalists, finalists
from runner.results.outcome import benchmark_table, outcome, report_markdown, trace_markdown
from runner.search.loop import SearchResult
from runner.search.types import Attempt, History


def confirmed(cand_ms: list[float], base_ms: list[float]) -> Verdict:
    """A confirmation whose faster baseline (torch.compile) took `base_ms` per round; eager twice as long."""
    t = lambda xs: summarize(xs, clock="monotonic", l2_flushed=True)  # noqa: E731
    eager = [2 * b for b in base_ms]
    conf = Confirmation(rounds=len(cand_ms), candidate_ms=cand_ms, eager_ms=eager, compile_ms=base_ms,
                        speedup_vs_eager=[e / c for e, c in zip(eager, cand_ms, strict=True)],
                        speedup_vs_compile=[b / c for b, c in zip(base_ms, cand_ms, strict=True)])
    return Verdict(candidate_id="c", problem="p", accepted=True, timing=t(cand_ms),
                   baselines=Baselines(eager=t(eager), compile=t(base_ms)), confirmation=conf)


def attempt(cid: str, ms: float, rewrite: str = "") -> Attempt:
    fmt = "kernelbench" if rewrite else "fast"
    c = Candidate(id=cid, format=fmt, backend="cpu", sources={"model_new.py" if rewrite else "kernel.cpp": "x"},
                  rewrite=rewrite)
    v = Verdict(candidate_id=cid, problem="p", accepted=True, timing=summarize([ms], clock="monotonic",
                                                                               l2_flushed=True))
    return Attempt(round=1, proposer="m", idea=f"idea {cid}", candidate=c, verdict=v)


def search_result(*attempts: Attempt) -> SearchResult:
    beam = sorted((a for a in attempts if a.accepted), key=lambda a: a.median_ms)
    return SearchResult(history=History(attempts=list(attempts)), beam=beam, stop_reason="rounds", rounds=1,
                        tokens_used=0, cost_usd=0.0, gpu_seconds=0.0, wall_seconds=0.0, candidates=len(attempts))


def test_the_margin_is_the_larger_of_the_floor_and_the_rounds_spread():
    steady = confirmed([1.0, 1.0, 1.0], [1.02, 1.02, 1.02]).confirmation
    assert spread(steady.speedup_vs_faster()) == 0 and margin(steady) == MIN_EFFECT
    noisy = confirmed([1.0, 1.0, 1.0], [1.1, 1.3, 1.2]).confirmation
    assert margin(noisy) == pytest.approx(0.2 / 1.2)


@pytest.mark.parametrize(("base_ms", "proposed"), [
    ([1.02, 1.02, 1.02], False),  # 2% in every round: under the 3% floor
    ([1.04, 1.04, 1.04], True),  # 4%: over it
    ([1.05, 1.25, 1.15], False),  # 1.15x pooled, but the rounds spread by 17%: under the margin
    ([1.10, 1.30, 1.20], True),  # 1.20x pooled against a 16.7% spread: over it
])
def test_a_kernel_is_proposed_only_above_the_minimum_effect(base_ms, proposed):
    best = attempt("k", 1.0)
    o = outcome("p", search_result(best), None, None, confirmed=confirmed([1.0, 1.0, 1.0], base_ms))
    assert o.improved is proposed, o.message
    assert o.margin == pytest.approx(max(MIN_EFFECT, spread([b / 1.0 for b in base_ms])))
    if proposed:
        assert f"margin {100 * o.margin:.0f}%" in o.message
    else:
        assert o.message.startswith("below the minimum effect") and "not proposed" in o.message


def test_the_finalists_are_the_fastest_kernel_and_the_fastest_rewrite_and_both_are_confirmed():
    k, w, w2 = attempt("k", 1.0), attempt("w", 1.1, rewrite="new module"), attempt("w2", 1.5, rewrite="other")
    result = search_result(k, w, w2)
    assert finalists(result) == (k, w)
    asked = []

    class Ev:
        def confirm(self, candidate, rounds=5):
            asked.append((candidate.id, rounds))
            return confirmed([1.0], [2.0])

    kv, wv = confirm_finalists(result, Ev(), 4)
    assert asked == [("k", 4), ("w", 4)] and kv is not None and wv is not None
    assert confirm_finalists(search_result(k), Ev(), 4)[1] is None  # no rewrite: one confirmation
    assert confirm_finalists(result, object(), 4) == (None, None)  # an evaluator that cannot confirm


@pytest.mark.parametrize(("kernel_ms", "rewrite_ms", "chosen"), [
    (1.0, 1.02, "rewrite"),  # 2% slower than the kernel: the simpler change wins
    (1.0, 1.09, "rewrite"),  # 9% slower: under the 10% a kernel must gain over a rewrite
    (1.0, 0.9, "rewrite"),  # faster
    (1.0, 1.2, "kernel"),  # 20% slower, in every round: the kernel
    (1.0, 1.99, "kernel"),  # the rewrite does not clear the minimum effect over the 2 ms baseline: the kernel
])
def test_the_rewrite_wins_when_it_is_as_fast_as_the_kernel_within_the_margin(kernel_ms, rewrite_ms, chosen):
    k, w = attempt("k", kernel_ms), attempt("w", rewrite_ms, rewrite="new text")
    o = outcome("p", search_result(k, w), None, None, confirmed=confirmed([kernel_ms] * 3, [2.0] * 3),
                confirmed_rewrite=confirmed([rewrite_ms] * 3, [2.0] * 3))
    assert o.improved and o.change == chosen and o.best.candidate.id == {"kernel": "k", "rewrite": "w"}[chosen]
    assert ("simpler change" in o.choice) is (chosen == "rewrite")
    assert o.rewrite is not None and o.rewrite.candidate.id == "w"
    # the rewrite stands behind a chosen kernel when it cleared its own margin (runner/results/files.py)
    assert (o.fallback is not None) is (chosen == "kernel" and rewrite_ms < 2.0 / (1 + MIN_EFFECT))
    if o.fallback is not None:
        assert o.fallback.message.startswith(f"{rewrite_ms:.4g} ms") and o.fallback.margin == o.margin
    table = benchmark_table(o)
    assert "| PyTorch rewrite" in table  # the rewrite's row, whichever is proposed
    assert f"Proposed change: {'a PyTorch rewrite of the module' if chosen == 'rewrite' else 'a kernel'}" in \
        report_markdown(o)


def test_a_kernel_faster_pooled_but_not_in_every_round_leaves_the_rewrite_proposed():
    """Pooled, the kernel is 25% faster than the rewrite, past both margins; but its slowest round (2.27x) is slower
    than the rewrite's fastest (2.35x): not faster in every round, so the simpler change is proposed."""
    k = claim(attempt("k", 1.0), confirmed([0.8, 0.8, 0.88], [2.0] * 3))
    w = claim(attempt("w", 1.0, rewrite="x"), confirmed([1.0, 1.0, 0.85], [2.0] * 3))
    assert k.eligible and w.eligible and k.speedup > w.speedup * (1 + max(k.margin, w.margin, 0.1))
    chosen, why = choose(k, w)
    assert chosen is w and "not faster than the PyTorch rewrite" in why and "in every round" in why, why
    steady = claim(attempt("w", 1.0, rewrite="x"), confirmed([1.0, 1.0, 0.9], [2.0] * 3))  # fastest round 2.22x
    chosen, why = choose(k, steady)
    assert chosen is k and "in every round and by more than 11% (what a kernel must gain over a rewrite: at least " \
        "10%)" in why, why
    assert "margin" not in why  # the PR's one margin is its claim's


def test_a_rewrite_alone_is_proposed_and_nothing_that_misses_the_margin_is():
    w = claim(attempt("w", 1.0, rewrite="x"), confirmed([1.0] * 3, [1.5] * 3))
    k = claim(attempt("k", 1.0), confirmed([1.0] * 3, [1.01] * 3))
    assert w.eligible and not k.eligible
    assert choose(None, w)[0] is w and choose(k, w)[0] is w and "no kernel did" in choose(k, w)[1]
    slow = claim(attempt("w", 1.0, rewrite="x"), confirmed([1.0] * 3, [1.01] * 3))
    chosen, why = choose(k, slow)
    assert chosen is k and not chosen.eligible and why.startswith("neither")


def test_every_trace_row_says_why():
    bad = Attempt(round=1, proposer="m", idea="i", candidate=Candidate(id="b", format="fast", sources={"k": "x"}),
                  verdict=Verdict(candidate_id="b", problem="p", accepted=False, stage="build"))
    k, slower = attempt("k", 1.0), attempt("s", 1.5)
    o = outcome("p", search_result(k, slower, bad), None, None, confirmed=confirmed([1.0] * 3, [2.0] * 3))
    rows = [line for line in trace_markdown(o).splitlines() if line.startswith("| ") and "---" not in line][1:]
    cells = [row.split(" | ")[-1].rstrip(" |") for row in rows]
    assert len(cells) == 3 and all(cells), rows
    assert "proposed" in cells[0] and "50% slower than the fastest" in cells[1]
    assert "rejected at build (no reason recorded)" in cells[2]


def test_a_verified_rows_why_says_its_place_against_the_floor_and_its_ptxas_resources():
    k = attempt("k", 1.0)
    res = KernelResources(name="fused", registers=40, spill_stores_bytes=8, spill_loads_bytes=8, shared_bytes=1024)
    k = k.model_copy(update={"verdict": k.verdict.model_copy(update={"build": BuildInfo(ok=True, seconds=1.0,
                                                                                         kernels=[res])})})
    plain = attempt("p", 2.0)
    floor = Roofline(bytes_moved=1 << 20, bandwidth_bytes_per_s=1e9, bandwidth_source="given", floor_ms=0.5)
    o = outcome("p", search_result(k, plain), None, floor)
    rows = [line for line in trace_markdown(o).splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert "50% of the floor; ptxas: fused: 40 registers, 16 B spilled, 1024 B shared, 0 B stack" in rows[0], rows
    assert "25% of the floor" in rows[1] and "ptxas" not in rows[1]  # a CPU kernel: ptxas reported nothing


@pytest.mark.parametrize(("base_ms", "proposed"), [
    ([1.5, 1.5, 0.5, 1.5, 1.6], True),  # one preempted round of five: the agreeing rounds all won
    ([1.5, 0.9, 0.5, 1.5, 1.6], False),  # two lost rounds: one of them agrees
    ([1.5, 0.5, 1.5], False),  # of three rounds, every round counts
])
def test_of_five_rounds_the_lowest_is_left_out_of_every_round(base_ms, proposed):
    c = confirmed([1.0] * len(base_ms), base_ms).confirmation
    assert won_every_round(c) is proposed
    o = outcome("p", search_result(attempt("k", 1.0)), None, None, confirmed=confirmed([1.0] * len(base_ms), base_ms))
    assert o.improved is proposed, o.message
    if not proposed:
        assert o.message.startswith("nothing beat torch.compile in every round")  # the helper's baselines: both
        assert ("highest and the lowest left out" in o.message) is (len(base_ms) >= 5)


@pytest.mark.parametrize(("cand_ms", "said"), [
    ([40.0, 50.0, 8.0, 45.0, 30.0], "slower: the fastest verified kernel lost every round (0.02-0.12x"),
    ([0.15, 0.07, 0.1, 0.12, 0.08], "faster but not provable on this host: the fastest verified kernel won every "
                                    "round (6.67-14.29x"),
    ([0.5, 2.0, 0.8, 1.5, 0.9], "not provable on this host: the fastest verified kernel measured 0.50-2.00x"),
])
def test_a_confirmation_too_noisy_for_a_figure_says_slower_unprovable_or_mixed(cand_ms, said):
    """The unstable-measurement rule refuses a figure; the claim still says what every round showed, so a kernel 40x
    slower and one that won every round by 7x are not given the same words."""
    v = confirmed(cand_ms, [1.0] * 5)
    v = v.model_copy(update={"accepted": False, "reasons": ["unstable-measurement: the rounds' medians spread by up "
                                                            "to 85% (more than 50%): ...; the host is too noisy"]})
    c = claim(attempt("k", 1.0), v)
    assert not c.eligible and c.message.startswith(said) and c.message.endswith("not proposed"), c.message
    assert ("rerun on an idle host" in c.message) is said.startswith("faster")
    other = v.model_copy(update={"reasons": ["mismatch: output 0", "unstable-measurement: spread"]})
    assert claim(attempt("k", 1.0), other).message.startswith("the fastest kernel failed when verified again")


def test_no_kernel_is_proposed_over_a_rewrite_that_measured_faster_but_too_noisy_for_a_figure():
    """As a CPU demo run of RowGain had it: the kernel 4.0-5.3x in every round, its one-line rewrite 18-51x in every round
    but its rounds spread 73%. Nothing is proposed (the rewrite has no figure, the kernel is the slower change); a
    kernel clearly faster than such a rewrite is still proposed, and a rewrite that failed is named as failed."""
    noisy = confirmed([0.07, 0.125, 0.09, 0.11, 0.08], [2.0] * 5)
    noisy = noisy.model_copy(update={"accepted": False, "reasons": ["unstable-measurement: the rounds' medians spread "
                                                                    "by up to 73% (more than 50%): ...; too noisy"]})
    w = claim(attempt("w", 0.1, rewrite="x"), noisy)
    k = claim(attempt("k", 0.42), confirmed([0.42, 0.43, 0.41, 0.42, 0.42], [2.0] * 5))
    assert k.eligible and not w.eligible and w.speed == "unprovable"
    chosen, why = choose(k, w)
    assert chosen is w and not chosen.eligible, why
    assert "no kernel is proposed over a simpler change" in why and "rerun on an idle host" in why, why
    o = outcome("p", search_result(attempt("k", 0.42), attempt("w", 0.1, rewrite="x")), None, None,
                confirmed=confirmed([0.42, 0.43, 0.41, 0.42, 0.42], [2.0] * 5), confirmed_rewrite=noisy)
    assert not o.improved and "not provable on this host" in o.message, o.message
    fast = claim(attempt("k", 0.01), confirmed([0.01] * 5, [2.0] * 5))  # 200x, past the rewrite's every round
    assert choose(fast, w)[0] is fast and "is not proposed (unprovable: " in choose(fast, w)[1]
    failed = claim(attempt("w", 0.1, rewrite="x"), noisy.model_copy(update={"reasons": ["mismatch: output 0"]}))
    assert choose(k, failed)[0] is k and "is not proposed (failed: " in choose(k, failed)[1]
