"""The LLM proposer through the real openai client over real HTTP to the scripted server: answers, failures, retries,
timeouts, budgets, prompt contents, replay, and the key never leaking."""

from __future__ import annotations

import logging
import time

import pytest
from pydantic import ValidationError

from runner.contract import Baselines, Roofline, SearchBudget
from runner.proposers.llm.proposer import LLMProposer, LLMSettings, llm_proposers
from runner.search.loop import search
from runner.search.trace import read_events
from runner.search.types import BudgetExhausted, GpuInfo, Idea, ProblemContext, ProposerUnavailable, Session
from tests.fakes.evaluators import TableEvaluator, timing
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.llm_helpers import IDEAS, SECRET, code_answer, settings

REFERENCE = "class Model(nn.Module):\n    def forward(self, x):\n        return torch.relu(x) * 2 + 1  # REF-MARK\n"
CTX = ProblemContext(
    name="relu2", reference_source=REFERENCE, backend="cpu",
    gpu=GpuInfo(name="NVIDIA H100 80GB HBM3", specs="132 SMs, 50 MB L2", copy_bandwidth_bytes_per_s=3.01e12),
    roofline=Roofline(bytes_moved=8_388_608, bandwidth_bytes_per_s=3.01e12, bandwidth_source="measured d2d copy",
                      floor_ms=0.002787),
    baselines=Baselines(eager=timing(1.0), compile=timing(0.8)),
)
IDEAS_T, IMPL_T, REPAIR_T = "## Task: ideas", "## Task: implement", "## Task: repair"
AGAIN_T = "## Task: answer again"


def run(srv, budget, trace, evaluator=None, **kw):
    return search(CTX, evaluator or TableEvaluator(), llm_proposers(settings(srv.url, **kw)), budget, trace)


def test_good_answers_flow_into_verified_kernels_and_prompts_carry_what_they_must(tmp_path):
    script = [
        Reply(IDEAS, match=IDEAS_T),
        Reply(code_answer("ms=0.9"), match=REPAIR_T),  # first: a repair continues the implement conversation
        # round 1: idea 1 (two variants), idea 2 (two variants), in request order
        Reply(code_answer("ms=0.5"), match=IMPL_T, times=1),
        Reply(code_answer("ms=0.7"), match=IMPL_T, times=1),
        Reply(code_answer("wrong"), match=IMPL_T, times=1),
        Reply(code_answer("ms=0.6"), match=IMPL_T, times=1),
        Reply(code_answer("ms=0.25"), match=IMPL_T),  # round 2
    ]
    with ScriptedLLM(script) as srv:
        res = run(srv, SearchBudget(rounds=2, ideas_per_round=2, implementations_per_idea=2, max_repairs=1),
                  tmp_path / "t.jsonl")
    assert res.best.median_ms == 0.25 and res.best.round == 2
    assert res.tokens_used == 300 * len(srv.completions())
    first = srv.completions()[0]
    assert IDEAS_T in first.text and "REF-MARK" in first.text and "NVIDIA H100 80GB HBM3" in first.text
    assert "3.010 TB/s" in first.text and "0.002787 ms" in first.text and "0.8 ms" in first.text
    impl = next(r for r in srv.completions() if IMPL_T in r.text)
    assert "fusebot_forward" in impl.text and "#define FB_MAX_DIMS" in impl.text  # the ABI header itself
    # round 2: the best kernel with its code and time, a slower one, and the failure's reason
    r2 = [r for r in srv.completions() if IDEAS_T in r.text][1]
    assert "FAKE: ms=0.5" in r2.text and "0.5 ms" in r2.text and "1.60x the faster baseline" in r2.text
    assert "FAKE: ms=0.9" in r2.text and "Slower verified variants" in r2.text
    # the wrong kernel's idea was also verified (its other variant): it is not listed as a failure
    assert "mismatch: trial 0" not in r2.text and "Vectorize loads with float4" in r2.text
    assert "% of the roofline floor" in r2.text
    repair = next(r for r in srv.completions() if REPAIR_T in r.text)
    assert "FAKE: wrong" in repair.text and "mismatch: trial 0" in repair.text and "verify stage" in repair.text
    assert all(r.body["model"] == "scripted-a" and r.body["max_completion_tokens"] == 2000 for r in srv.completions())


def test_an_answer_without_code_is_a_failed_attempt_and_a_failed_build_is_repaired_with_the_compiler_output(
        tmp_path):
    script = [
        Reply("1. Use a lookup table for the activation function.\n", match=IDEAS_T),
        Reply(code_answer("ms=0.4"), match=REPAIR_T),
        Reply(code_answer("ms=0.45"), match=AGAIN_T),
        Reply("I'd use a lookup table, but I won't write the code.", match=IMPL_T, times=1),
        Reply(code_answer("build-error"), match=IMPL_T, times=1),
    ]
    with ScriptedLLM(script) as srv:
        res = run(srv, SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=2), tmp_path / "t.jsonl")
    no_code = [a for a in res.history.attempts if a.candidate is None]
    assert [a.failure for a in no_code] == ["scripted-a: no fenced code block in the answer"]
    again = next(r for r in srv.completions() if AGAIN_T in r.text)  # the model was told, and answered with code
    assert "could not be used: no fenced code block in the answer" in again.text
    assert [m["role"] for m in again.body["messages"]] == ["system", "user", "assistant", "user"]
    assert 0.45 in [a.median_ms for a in res.history.attempts]
    repair = next(r for r in srv.completions() if REPAIR_T in r.text)
    assert "'flaot' was not declared in this scope" in repair.text and "### Compiler output" in repair.text
    assert res.best.median_ms == 0.4 and res.best.repair_of is not None
    events = list(read_events(tmp_path / "t.jsonl"))
    assert [e["reason"] for e in events if e["event"] == "failed"] == [no_code[0].failure]


def test_429_waits_what_retry_after_says(tmp_path):
    script = [Reply(status=429, headers={"Retry-After": "1"}, times=1), Reply(IDEAS)]
    with ScriptedLLM(script) as srv:
        p = LLMProposer(settings(srv.url), "scripted-a")
        p.bind(Session())
        ideas = p.ideas(CTX, __import__("runner.search.types").search.types.History(), 2)
    assert len(ideas) == 2
    a, b = srv.completions()
    assert (a.status, b.status) == (429, 200)
    assert 0.95 <= b.at - a.at < 2.5  # the exponential backoff alone would wait ~0.01 s


def test_5xx_are_retried_with_backoff_and_give_up_after_max_attempts():
    with ScriptedLLM([Reply(status=500, times=2), Reply(status=503, times=1), Reply(IDEAS)]) as srv:
        p = LLMProposer(settings(srv.url, max_attempts=4), "m")
        p.bind(s := Session())
        assert p.complete([{"role": "user", "content": "hi"}], "ideas").text == IDEAS
        assert [r.status for r in srv.completions()] == [500, 500, 503, 200]
        assert s.tokens_used == 300
    with ScriptedLLM([Reply(status=502)]) as srv:
        p = LLMProposer(settings(srv.url, max_attempts=3), "m")
        p.bind(s := Session())
        with pytest.raises(ProposerUnavailable, match="HTTP 502 after 3 tries"):
            p.complete([{"role": "user", "content": "hi"}], "ideas")
        assert len(srv.completions()) == 3 and s.tokens_used == 0


def test_a_request_that_hangs_past_the_timeout_is_retried():
    with ScriptedLLM([Reply(IDEAS, delay_s=3, times=1), Reply(IDEAS)]) as srv:
        p = LLMProposer(settings(srv.url, timeout_s=0.5), "m")
        p.bind(Session())
        t0 = time.monotonic()
        assert p.complete([{"role": "user", "content": "hi"}], "ideas").text == IDEAS
        assert len(srv.completions()) == 2 and 0.5 <= time.monotonic() - t0 < 2.5


def test_a_4xx_is_a_failed_attempt_not_a_retry_and_not_a_crash():
    with ScriptedLLM([Reply(status=400)]) as srv:
        p = LLMProposer(settings(srv.url), "m")
        failures = []
        p.bind(Session(failed=lambda idea, why: failures.append(why)))
        assert p.implement(CTX, Idea(text="fuse"), __import__("runner.search.types").search.types.History(), 1) == []
        assert len(srv.completions()) == 1 and failures == ["m: the request was rejected"]


def test_the_token_budget_stops_the_search_before_exceeding_it(tmp_path):
    # each answer costs 100 + 200 tokens; a request is sent only if its prompt estimate (chars / 3) + 100 fits (the
    # prompt carries runner/csrc/fusebot.h: the budget leaves room for the ideas and a round of implementations)
    impls = [Reply(code_answer(f"ms={1 - k / 20}"), match=IMPL_T, times=1) for k in range(12)]
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T), *impls]) as srv:
        res = run(srv, SearchBudget(rounds=3, ideas_per_round=2, implementations_per_idea=2, tokens=3200),
                  tmp_path / "t.jsonl")
    n = len(srv.completions())
    assert res.stop_reason.startswith("budget: tokens") and res.tokens_used == 300 * n <= 3200
    assert 3 <= n < 8  # it ran, and stopped before the 15 requests of the whole search
    assert res.best is not None
    # every answer paid for was judged: one candidate per implementation answered
    assert res.candidates == len([r for r in srv.completions() if IMPL_T in r.text])
    # when the budget is tight, the completion cap shrinks to what is left
    assert min(r.body["max_completion_tokens"] for r in srv.completions()) < 2000


def test_cost_is_counted_when_a_price_is_configured(tmp_path):
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T), Reply(code_answer("ms=0.5"))]) as srv:
        res = run(srv, SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1), tmp_path / "t.jsonl",
                  price_per_1k_prompt_usd=1.0, price_per_1k_completion_usd=2.0)
    assert res.cost_usd == pytest.approx(len(srv.completions()) * (0.1 + 0.4))


def test_several_models_share_the_branches(tmp_path):
    script = [Reply(IDEAS, match=IDEAS_T), Reply(code_answer("ms=0.5"))]
    with ScriptedLLM(script) as srv:
        run(srv, SearchBudget(rounds=1, ideas_per_round=4, implementations_per_idea=1), tmp_path / "t.jsonl",
            models="model-x:3,model-y:1")
    ideas_asked = {r.body["model"]: r.text for r in srv.completions() if IDEAS_T in r.text}
    assert "Propose 3 distinct" in ideas_asked["model-x"] and "Propose 1 distinct" in ideas_asked["model-y"]


def test_a_search_run_again_on_its_trace_replays_answers_without_requests(tmp_path):
    script = [Reply(IDEAS, match=IDEAS_T), Reply(code_answer("ms=0.3"), match=REPAIR_T),
              Reply(code_answer("build-error"), match=IMPL_T)]
    budget = SearchBudget(rounds=2, ideas_per_round=2, implementations_per_idea=1)
    with ScriptedLLM(script) as srv:
        first = run(srv, budget, tmp_path / "t.jsonl")
        n = len(srv.completions())
        ev = TableEvaluator()
        second = run(srv, budget, tmp_path / "t.jsonl", evaluator=ev)
        assert len(srv.completions()) == n and ev.evaluated == []
    assert second.tokens_used == first.tokens_used and second.best.candidate == first.best.candidate


def test_the_key_never_reaches_logs_trace_or_prompts(tmp_path, caplog):
    caplog.set_level(logging.DEBUG)
    script = [Reply(status=429, headers={"Retry-After": "0"}, times=1), Reply(IDEAS, match=IDEAS_T),
              Reply("no code", match=REPAIR_T), Reply(code_answer("build-error"), match=IMPL_T)]
    with ScriptedLLM(script) as srv:
        res = run(srv, SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1), tmp_path / "t.jsonl")
    assert srv.completions()[0].headers["authorization"] == f"Bearer {SECRET}"  # the key was really used
    assert SECRET not in caplog.text and len(caplog.records) > 5
    assert SECRET not in (tmp_path / "t.jsonl").read_text()
    assert not any(SECRET in r.text for r in srv.completions())
    s = settings(srv.url)
    assert SECRET not in repr(s) and SECRET not in str(s.model_dump()) and SECRET not in s.model_dump_json()
    assert SECRET not in repr(res)


def test_settings_are_validated_at_start(monkeypatch):
    monkeypatch.setenv("FUSEBOT_LLM_BASE_URL", "http://127.0.0.1:9/v1/")
    monkeypatch.setenv("FUSEBOT_LLM_API_KEY", "sk-real")
    monkeypatch.setenv("FUSEBOT_LLM_MODELS", "o3:2, gemini-2.5-pro, llama3:70b")
    s = LLMSettings()
    assert s.base_url == "http://127.0.0.1:9/v1"
    assert [(m.name, m.share) for m in s.models] == [("o3", 2.0), ("gemini-2.5-pro", 1.0), ("llama3:70b", 1.0)]
    monkeypatch.setenv("FUSEBOT_LLM_MODELS", '[{"name": "a", "share": 0.5}]')
    assert LLMSettings().models[0].share == 0.5
    with pytest.raises(ValidationError, match="placeholder"):
        LLMSettings(api_key="changeme")
    with pytest.raises(ValidationError, match="http"):
        LLMSettings(base_url="ftp://x")
    with pytest.raises(ValidationError):
        LLMSettings(models="a:0")
    with pytest.raises(ValidationError):
        LLMSettings(models="")


def test_budget_exhausted_before_a_request_that_cannot_fit():
    with ScriptedLLM([Reply(IDEAS)]) as srv:
        p = LLMProposer(settings(srv.url), "m")
        p.bind(Session(tokens_limit=150))
        with pytest.raises(BudgetExhausted):
            p.complete([{"role": "user", "content": "x" * 300}], "ideas")
        assert srv.completions() == []


def test_retry_after_is_read_as_seconds_milliseconds_or_an_http_date():
    import email.utils

    import httpx

    from runner.proposers.llm.proposer import retry_after_s

    class E(Exception):
        def __init__(self, headers):
            self.response = httpx.Response(429, headers=headers)

    assert retry_after_s(E({"retry-after": "7"})) == 7.0
    assert retry_after_s(E({"retry-after-ms": "250", "retry-after": "7"})) == 0.25
    when = email.utils.formatdate(time.time() + 30, usegmt=True)
    assert 25 <= retry_after_s(E({"retry-after": when})) <= 31
    assert retry_after_s(E({})) is None and retry_after_s(E({"retry-after": "soon"})) is None
    assert retry_after_s(ValueError()) is None
