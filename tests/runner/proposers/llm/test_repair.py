"""Repair as a conversation, over real HTTP to the scripted server: answers with no usable code (cut off, filtered,
reasoning only) are told why and asked again; a rejected kernel's repair sees every earlier attempt of its chain; a
KernelBench-format answer is accepted in its format; a prompt too long for the model's context is shrunk, not counted
as a failure."""

from __future__ import annotations

from runner.contract import SearchBudget
from runner.search.trace import read_events
from tests.fakes.evaluators import TableEvaluator
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.llm_helpers import IDEAS, code_answer
from tests.runner.proposers.llm.test_proposer import AGAIN_T, IDEAS_T, IMPL_T, REPAIR_T, run

ONE = SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1, max_repairs=4)
CONTEXT_ERROR = {"message": "This model's maximum context length is 128000 tokens. However, your messages resulted "
                            "in 131000 tokens.", "type": "invalid_request_error", "code": "context_length_exceeded"}


def failures(trace) -> list[str]:
    return [e["reason"] for e in read_events(trace) if e["event"] == "failed"]


def test_cut_off_filtered_and_reasoning_only_answers_are_detected_and_asked_again(tmp_path):
    cut = code_answer("ms=0.5").rsplit("}", 2)[0]  # the fence never closes, the braces do not balance
    script = [
        Reply(IDEAS, match=IDEAS_T),
        Reply(code_answer("ms=0.5"), match="(finish_reason=content_filter)", times=1),
        Reply("", match="(finish_reason=length)", reasoning="Let me think about float4 loads " * 40, times=1),
        Reply("Sorry, I can't help with that.", match="only reasoning", finish_reason="content_filter", times=1),
        Reply(cut, match=IMPL_T, finish_reason="length"),
    ]
    with ScriptedLLM(script) as srv:
        res = run(srv, ONE, tmp_path / "t.jsonl")
    why = failures(tmp_path / "t.jsonl")
    assert len(why) == 3 and "finish_reason=length" in why[0] and "only reasoning (1280 characters)" in why[1]
    assert "content filter withheld the answer" in why[2]
    last = srv.completions()[-1]
    assert [m["role"] for m in last.body["messages"]] == ["system", "user"] + ["assistant", "user"] * 3
    assert AGAIN_T in last.text and res.best.median_ms == 0.5 and res.progress.verified == 1


def test_no_code_is_asked_again_only_up_to_max_repairs(tmp_path):
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T), Reply("I would fuse it.", match=IMPL_T)]) as srv:
        res = run(srv, ONE.model_copy(update={"max_repairs": 2}), tmp_path / "t.jsonl")
    assert len([r for r in srv.completions() if IMPL_T in r.text]) == 3 and res.best is None
    assert len(failures(tmp_path / "t.jsonl")) == 3


def test_each_repair_sees_every_earlier_attempt_of_its_chain(tmp_path):
    script = [
        Reply(IDEAS, match=IDEAS_T),
        Reply(code_answer("ms=0.4"), match="FAKE: wrong"),  # the third try: after a build error, then a mismatch
        Reply(code_answer("wrong"), match=REPAIR_T),
        Reply(code_answer("build-error"), match=IMPL_T),
    ]
    with ScriptedLLM(script) as srv:
        res = run(srv, ONE, tmp_path / "t.jsonl")
    third = srv.completions()[-1]
    roles = [m["role"] for m in third.body["messages"]]
    assert roles == ["system", "user", "assistant", "user", "assistant", "user"]
    texts = [m["content"] for m in third.body["messages"]]
    assert "FAKE: build-error" in texts[2] and "'flaot' was not declared" in texts[3] and "build stage" in texts[3]
    assert "FAKE: wrong" in texts[4] and "verify stage" in texts[5] and "mismatch: trial 0" in texts[5]
    assert res.best.median_ms == 0.4 and res.best.candidate.id == "r1-scripted-a-i0-c0-fix2"


def test_a_kernelbench_answer_is_accepted_in_its_format(tmp_path):
    kb = ("```python\nimport torch\n# FAKE: ms=0.45\nclass ModelNew(torch.nn.Module):\n"
          "    def forward(self, x):\n        return torch.relu(x) * 2 + 1\n```\n")
    with ScriptedLLM([Reply(IDEAS, match=IDEAS_T), Reply(kb, match=IMPL_T)]) as srv:
        ev = TableEvaluator()
        res = run(srv, ONE, tmp_path / "t.jsonl", evaluator=ev)
    c = ev.evaluated[0]
    assert c.format == "kernelbench" and list(c.sources) == ["candidate.py"] and "class ModelNew" in c.sources[
        "candidate.py"]
    assert res.best.median_ms == 0.45 and failures(tmp_path / "t.jsonl") == []


def test_a_context_length_error_shrinks_the_prompt_and_is_not_a_failed_attempt(tmp_path):
    script = [
        # the ideas prompt is too long while the reference keeps its comments
        Reply(status=400, error=CONTEXT_ERROR, match="# REF-MARK"),
        Reply(IDEAS, match=IDEAS_T),
    ]
    with ScriptedLLM(script) as srv:
        res = run(srv, ONE.model_copy(update={"max_repairs": 0}), tmp_path / "t.jsonl")
    asked = [r for r in srv.completions() if IDEAS_T in r.text]
    assert [r.status for r in asked] == [400, 400, 400, 200]  # whole, then history dropped, then comments dropped
    assert "# REF-MARK" not in asked[-1].text and "return torch.relu(x) * 2 + 1" in asked[-1].text
    assert len(res.history.ideas) == 1 and not any(a.idea == "(ideas)" for a in res.history.attempts)
    assert res.tokens_used == 300  # the refused prompts cost nothing


def test_a_long_repair_conversation_drops_its_oldest_attempts_to_fit(tmp_path):
    script = [
        Reply(IDEAS, match=IDEAS_T),
        # the context holds one attempt and its verdict, not two
        Reply(status=400, error=CONTEXT_ERROR, match=("FAKE: build-error", "FAKE: wrong"),
              unless="earlier attempt(s) dropped"),
        Reply(code_answer("ms=0.4"), match="FAKE: wrong"),
        Reply(code_answer("wrong"), match=REPAIR_T),
        Reply(code_answer("build-error"), match=IMPL_T),
    ]
    with ScriptedLLM(script) as srv:
        res = run(srv, ONE, tmp_path / "t.jsonl")
    assert [r.status for r in srv.completions()][-2:] == [400, 200]
    shrunk = srv.completions()[-1]
    assert [m["role"] for m in shrunk.body["messages"]] == ["system", "user", "assistant", "user"]
    assert "[1 earlier attempt(s) dropped" in shrunk.text and "FAKE: wrong" in shrunk.text
    assert res.best.median_ms == 0.4 and len(failures(tmp_path / "t.jsonl")) == 0
