"""The LLM proposer: ideas, implementations and repairs from any OpenAI-compatible endpoint.

One `LLMProposer` per model; `llm_proposers(settings)` gives each configured model with its share of the branches,
all on one client. Requests go through runner/proposers/llm/client.py (cache, budget, retries, at most
`max_concurrency` in flight); an idea's variants are asked for concurrently.

Every kernel is a conversation. An answer with no usable code (no fenced block, cut off at the completion limit
(`finish_reason=length`), withheld by a content filter, or reasoning with no final content) is a failed attempt, and
the model is told exactly that and asked again, up to the search's `max_repairs` times. A kernel the harness rejects
goes back as the next turn of the conversation that wrote it, so each repair sees every earlier attempt of its chain
with its verdict, not only the latest. A KernelBench-format answer (a ModelNew) where the fast format was asked for is
accepted in its own format. A prompt the endpoint refuses as too long for the model's context is shrunk (the oldest
attempts dropped, then the history sections, then the reference's comments) and sent again, not counted as a failure.
"""

from __future__ import annotations

import hashlib
import logging
from functools import cached_property
from importlib import resources

import openai

from runner.contract import Candidate, Verdict
from runner.proposers.llm import prompts
from runner.proposers.llm.client import (
    Endpoint,
    LLMSettings,
    PromptTooLong,
    estimate_tokens,
    make_client,
    retry_after_s,
    retryable,
)
from runner.proposers.llm.extract import extract_code, extract_ideas
from runner.proposers.llm.facts import requested_flags
from runner.search.pool import CallThreads
from runner.search.types import Answer, BudgetExhausted, History, Idea, ProblemContext, Session

__all__ = ["LLMProposer", "LLMSettings", "estimate_tokens", "llm_proposers", "retry_after_s", "retryable"]

log = logging.getLogger(__name__)


def _code_key(c: Candidate) -> str:
    return hashlib.sha256("\0".join(f"{k}\0{v}" for k, v in sorted(c.sources.items())).encode()).hexdigest()


def no_code_reason(answer: Answer, fmt: str) -> str | None:
    """Why an answer's code cannot be used as it stands, from how it ended; None when it ended normally."""
    if answer.finish_reason == "content_filter":
        return "the provider's content filter withheld the answer (finish_reason=content_filter)"
    if not answer.text.strip():
        if answer.reasoning_chars:
            return (f"the answer held only reasoning ({answer.reasoning_chars} characters) and no final content: the "
                    "completion budget was spent thinking")
        return f"the answer was empty (finish_reason={answer.finish_reason})"
    if answer.finish_reason == "length" and extract_code(answer.text, fmt)[0] is None:
        return "the answer was cut off at the completion-token limit (finish_reason=length) before its code was whole"
    return None


class LLMProposer:
    """A Proposer backed by one model of an OpenAI-compatible endpoint."""

    remote = True  # answers over the network: builtin proposers seed the first beam before it is asked

    def __init__(self, settings: LLMSettings, model: str, client: openai.OpenAI | None = None):
        self.settings = settings
        self.model = model
        self.name = model
        self.max_concurrency = settings.max_concurrency
        self.client = client or make_client(settings)
        self.session = Session()
        self.endpoint = Endpoint(settings, model, self.client, self.session)
        self._conversations: dict[str, prompts.Messages] = {}  # code key -> the conversation that wrote it
        self._variants: CallThreads | None = None

    @cached_property
    def abi_header(self) -> str:
        return resources.files("runner").joinpath("csrc/fusebot.h").read_text()

    def bind(self, session: Session) -> None:
        self.session = session
        self.endpoint = Endpoint(self.settings, self.model, self.client, session)

    def complete(self, messages: prompts.Messages, purpose: str) -> Answer | None:
        return self.endpoint.complete(messages, purpose)

    # ---- asking, shrinking, answering again ---------------------------------------------------------------------
    def ask(self, ctx: ProblemContext, messages: prompts.Messages, purpose: str) -> tuple[Answer | None, str]:
        """The answer to the messages, shrunk as often as the endpoint says they exceed the model's context."""
        why = ""
        for level in range(prompts.SHRINK_LEVELS):
            try:
                answer = self.complete(prompts.shrink(messages, level, ctx.reference_source), purpose)
            except PromptTooLong as e:
                log.warning("%s; shrinking the prompt (level %d)", e, level + 1)
                why = str(e)
                continue
            return answer, "" if answer is not None else f"{self.model}: the request was rejected"
        return None, f"{why}, even shrunk"

    def _candidate(self, ctx: ProblemContext, idea: Idea, answer: Answer,
                   parent: str | None) -> tuple[Candidate | None, str]:
        why = no_code_reason(answer, ctx.format)
        if why is not None:
            return None, why
        fmt, name = ctx.format, prompts.source_filename(ctx)
        code, why = extract_code(answer.text, fmt)
        if code is None and fmt == "fast":  # a KernelBench-format answer: accepted in its own format
            kb, _ = extract_code(answer.text, "kernelbench")
            if kb is not None:
                code, fmt, name = kb, "kernelbench", "candidate.py"
        if code is None:
            return None, why
        flags = requested_flags(code, ctx) if fmt == "fast" else []
        return Candidate(id=f"{self.name}-{answer.key[:12]}", format=fmt, backend=ctx.backend, sources={name: code},
                         extra_cflags=flags, idea=idea.text, parent=parent), ""

    def _converse(self, ctx: ProblemContext, idea: Idea, messages: prompts.Messages, purpose: str,
                  parent: str | None) -> Candidate | None:
        """Ask; while the answer has no usable code, say why and ask again (up to the search's max_repairs)."""
        for turn in range(self.session.max_repairs + 1):
            answer, failure = self.ask(ctx, messages, purpose if turn == 0 else "answer again")
            if answer is None:
                self.session.failed(idea, failure)
                return None
            c, why = self._candidate(ctx, idea, answer, parent)
            if c is not None:
                self._conversations[_code_key(c)] = [*messages, prompts.assistant(answer.text)]
                return c
            self.session.failed(idea, f"{self.model}: {why}")
            messages = [*messages, prompts.assistant(answer.text or "(no content)"),
                        {"role": "user", "content": prompts.no_code_message(ctx, why)}]
        return None

    # ---- the Proposer interface ---------------------------------------------------------------------------------
    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        answer, failure = self.ask(ctx, prompts.ideas_prompt(ctx, history, n), "ideas")
        texts = extract_ideas(answer.text, n) if answer else []
        if not texts:
            ended = answer is not None and (answer.finish_reason == "content_filter" or not answer.text.strip())
            why = (f"{self.model}: {no_code_reason(answer, 'fast')}" if ended and answer is not None
                   else failure or f"{self.model}: no ideas in the answer")
            self.session.failed(Idea(text="(ideas)", proposer=self.name), why)
        return [Idea(text=t, proposer=self.name) for t in texts]

    def _variant(self, ctx: ProblemContext, idea: Idea, history: History, k: int, n: int) -> Candidate | None:
        messages = prompts.implement_prompt(ctx, idea, history, self.abi_header, variant=k, variants=n)
        return self._converse(ctx, idea, messages, "implement", None)

    def implement(self, ctx: ProblemContext, idea: Idea, history: History, n: int) -> list[Candidate]:
        """n variants of the idea, asked for concurrently. Variants answered before the token budget ran out are
        kept (they are paid for); the budget's stop is raised only when none was."""
        if n <= 1 or self.max_concurrency <= 1:
            calls = [lambda k=k: self._variant(ctx, idea, history, k, n) for k in range(n)]
        else:
            if self._variants is None:
                self._variants = CallThreads(self.max_concurrency, f"llm-{self.name}")
            calls = [f.result for f in [self._variants.submit(self._variant, ctx, idea, history, k, n)
                                        for k in range(n)]]
        found, spent = [], None
        for call in calls:
            try:
                found.append(call())
            except BudgetExhausted as e:
                spent = e
        if spent is not None and not any(found):
            raise spent
        return [c for c in found if c is not None]

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        """The next turn of the conversation that wrote the candidate (every earlier attempt of its chain in view);
        a candidate this proposer did not write gets a repair prompt of its own."""
        before = self._conversations.get(_code_key(candidate))
        if before is None:
            messages = prompts.repair_prompt(ctx, candidate, verdict, self.abi_header)
        else:
            messages = [*before, {"role": "user", "content": prompts.verdict_message(ctx, candidate, verdict)}]
        return self._converse(ctx, Idea(text=candidate.idea, proposer=self.name), messages, "repair", candidate.id)


def llm_proposers(settings: LLMSettings) -> list[tuple[LLMProposer, float]]:
    """One proposer per configured model, with its share of the branches, sharing one client."""
    client = make_client(settings)
    return [(LLMProposer(settings, m.name, client), m.share) for m in settings.models]
