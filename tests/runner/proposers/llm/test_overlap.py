"""Concurrency end to end over real HTTP: models are asked at the same time, an idea's variants too, and the harness
evaluates candidates that are ready while a slow model is still thinking; the token budget holds under concurrent
requests. One test runs the real CPU harness."""

from __future__ import annotations

import time

from runner.contract import ProblemSpec, SearchBudget
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import problem_context
from runner.proposers.llm.proposer import llm_proposers
from runner.search.loop import search
from tests.fakes.evaluators import TableEvaluator
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.conftest import FAST_TIMER
from tests.runner.cpu_kernels import GOOD, PROBLEM, answer
from tests.runner.llm_helpers import IDEAS, code_answer, settings
from tests.runner.proposers.llm.test_proposer import CTX, IDEAS_T, IMPL_T

SLOW_S = 3.0  # a reasoning model's minutes, scaled down
TWO_MODELS = dict(models="fast-m,slow-m", max_concurrency=4)


class Clocked:
    """An evaluator that records, per batch, the wall time it started and ended and the ids it evaluated."""

    def __init__(self, inner):
        self.inner = inner
        self.batches: list[tuple[float, float, list[str]]] = []

    def __getattr__(self, name):
        return getattr(self.inner, name)

    def evaluate_many(self, candidates):
        t0 = time.time()
        out = self.inner.evaluate_many(candidates)
        self.batches.append((t0, time.time(), [c.id for c in candidates]))
        return out


def test_models_and_variants_are_asked_concurrently_and_evaluation_overlaps_a_model_still_thinking(tmp_path):
    script = [
        Reply(IDEAS, match=IDEAS_T, delay_s=0.5),
        Reply(code_answer("ms=0.5"), match=IMPL_T, model="fast-m"),
        Reply(code_answer("ms=0.4"), match=IMPL_T, model="slow-m", delay_s=2.0),
    ]
    ev = Clocked(TableEvaluator())
    with ScriptedLLM(script) as srv:
        t0 = time.monotonic()
        res = search(CTX, ev, llm_proposers(settings(srv.url, **TWO_MODELS)),
                     SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=2), tmp_path / "t.jsonl",
                     gather_s=0.2)
        wall_s = time.monotonic() - t0
    ideas = [r for r in srv.completions() if IDEAS_T in r.text]
    assert abs(ideas[0].at - ideas[1].at) < 0.3  # both models asked at once
    slow = [r for r in srv.completions() if IMPL_T in r.text and r.body["model"] == "slow-m"]
    assert len(slow) == 2 and abs(slow[0].at - slow[1].at) < 0.3  # its two variants too
    first_start, _, first_ids = ev.batches[0]
    assert all("fast-m" in i for i in first_ids) and first_start < min(r.done_at for r in slow)
    assert len(res.history.attempts) == 4 and res.best.median_ms == 0.4  # (each model's two variants are one code)
    assert wall_s < 0.5 + 2.0 + 1.5  # serially: 2 x 0.5 s of ideas, then 2 x 2 s of the slow model's variants


def test_the_token_budget_holds_under_concurrent_requests(tmp_path):
    impls = [Reply(code_answer(f"ms={1 - k / 20}"), match=IMPL_T, times=1, delay_s=0.2) for k in range(12)]
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T), *impls]) as srv:
        res = search(CTX, TableEvaluator(), llm_proposers(settings(srv.url, max_concurrency=4)),
                     SearchBudget(rounds=3, ideas_per_round=2, implementations_per_idea=2, tokens=2500),
                     tmp_path / "t.jsonl")
    assert res.stop_reason.startswith("budget: tokens") and res.tokens_used == 300 * len(srv.completions()) <= 2500
    # every answer paid for was judged, those that came in together with the one that spent the budget too
    assert res.candidates == len([r for r in srv.completions() if IMPL_T in r.text])


def test_cost_is_what_the_endpoint_reports_when_it_reports_one(tmp_path):
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T, cost=0.002), Reply(code_answer("ms=0.5"), cost=0.01)]) as srv:
        res = search(CTX, TableEvaluator(), llm_proposers(settings(srv.url, price_per_1k_prompt_usd=5.0)),
                     SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1), tmp_path / "t.jsonl")
    assert abs(res.cost_usd - 0.012) < 1e-9 and res.credit[0].cost_usd == res.cost_usd


def test_the_real_cpu_harness_verifies_a_kernel_while_a_slow_model_is_still_thinking(tmp_path, harness_cache):
    """The order of events, with seconds of slack: the slow model answers 8 s after it was asked, and the harness's
    first batch must start in the first half of that wait (it starts once the fast model's answer is parsed)."""
    slow_s = 8.0
    script = [
        Reply(IDEAS, match=IDEAS_T),
        Reply(answer(GOOD, "fast"), match=IMPL_T, model="fast-m"),
        Reply(answer(GOOD, "slow"), match=IMPL_T, model="slow-m", delay_s=slow_s),
    ]
    spec = ProblemSpec(name="affine_relu_chain", path=str(PROBLEM))
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=cfg) as real, ScriptedLLM(script) as srv:
        ctx = problem_context(spec, real, "cpu")
        ev = Clocked(real)
        t0 = time.time()
        res = search(ctx, ev, llm_proposers(settings(srv.url, timeout_s=60.0, **TWO_MODELS)),
                     SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=1), tmp_path / "t.jsonl",
                     gather_s=0.2)
    slow = next(r for r in srv.completions() if IMPL_T in r.text and r.body["model"] == "slow-m")
    first_start, _, first_ids = ev.batches[0]
    assert first_ids == ["r1-fast-m-i0-c0"] and first_start < slow.done_at - slow_s / 2, (first_start - t0)
    assert slow.done_at - slow.at >= slow_s  # the harness was building and verifying while slow-m thought
    assert res.candidates == 2 and {c.name: c.candidates for c in res.credit} == {"fast-m": 1, "slow-m": 1}
    fast = next(a for a in res.history.attempts if a.candidate and a.candidate.id == "r1-fast-m-i0-c0")
    assert fast.accepted, fast.reasons
