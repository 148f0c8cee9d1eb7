"""The `Proposer` interface: where ideas and kernels come from.

A proposer turns a problem and what was tried so far into plain-language ideas, implements an idea as candidates,
and repairs a candidate the harness rejected. The LLM proposer (runner/proposers/llm/proposer.py) and the builtin strategy
catalog are two implementations; the search (runner/search/loop.py) pools several of them into one population.

A bad answer is data: `implement` may return fewer candidates than asked (an answer with no usable code is reported
through `Session.failed` and becomes a failed attempt in the archive); `repair` returns None when it has nothing.
Running out of budget raises `BudgetExhausted`; an endpoint that stays down after its retries raises
`ProposerUnavailable`. Everything here is plain data, importable without torch.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from runner.contract import Backend, Baselines, Candidate, Roofline, Verdict


class BudgetExhausted(Exception):  # noqa: N818 - a stop signal, not an error
    """The next step would exceed the search budget (tokens, candidates, seconds)."""

    def __init__(self, resource: str, detail: str = ""):
        super().__init__(f"{resource} budget exhausted{': ' + detail if detail else ''}")
        self.resource = resource


class ProposerUnavailable(Exception):  # noqa: N818 - the proposer is out of the search, the search goes on
    """The proposer cannot answer at all (its endpoint stayed down after every retry)."""


class _Data(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Idea(_Data):
    """One plain-language optimization idea, e.g. "one warp per row, float4 loads, online softmax"."""

    text: str
    proposer: str = ""
    round: int = 0
    index: int = 0

    @property
    def id(self) -> str:
        return f"r{self.round}-{self.proposer}-i{self.index}"


class GpuInfo(_Data):
    """What is known about the target device. Ceilings are measured where the harness measured them."""

    name: str
    specs: str = ""  # e.g. "132 SMs, 50 MB L2, 80 GB HBM3"
    copy_bandwidth_bytes_per_s: float | None = None
    notes: str = ""


class ProblemContext(_Data):
    """Everything a proposer may know about the problem: never anything the harness keeps secret."""

    name: str
    reference_source: str
    backend: Backend = "cuda"
    format: str = "fast"  # what `implement` must produce: "fast" (C ABI) or "kernelbench" (ModelNew)
    input_summary: str = ""  # e.g. "x: float32[16, 16384]"
    gpu: GpuInfo | None = None
    roofline: Roofline | None = None
    baselines: Baselines | None = None

    @property
    def baseline_best_ms(self) -> float | None:
        return best_baseline_ms(self.baselines)


def best_baseline_ms(baselines: Baselines | None) -> float | None:
    """The faster of eager and torch.compile: the time a kernel must beat."""
    times = [t.median_ms for t in (baselines.eager, baselines.compile) if t] if baselines else []
    return min(times) if times else None


class Attempt(_Data):
    """One entry of the archive: a candidate with its verdict, or an answer that yielded no candidate."""

    round: int
    proposer: str
    idea: str
    candidate: Candidate | None = None
    verdict: Verdict | None = None
    failure: str = ""  # why no candidate came out (no code in the answer, ...)
    repair_of: str | None = None

    @property
    def accepted(self) -> bool:
        return bool(self.verdict and self.verdict.accepted and self.verdict.timing)

    @property
    def median_ms(self) -> float | None:
        return self.verdict.timing.median_ms if self.accepted and self.verdict and self.verdict.timing else None

    @property
    def reasons(self) -> list[str]:
        if self.verdict is not None:
            return list(self.verdict.reasons)
        return [self.failure] if self.failure else []


class History(_Data):
    """Every attempt so far, in order, and every idea proposed."""

    attempts: list[Attempt] = Field(default_factory=list)
    ideas: list[Idea] = Field(default_factory=list)
    beam: list[str] = Field(default_factory=list)  # ids of the fastest verified candidates, fastest first

    def accepted(self) -> list[Attempt]:
        """Accepted attempts, fastest first."""
        return sorted((a for a in self.attempts if a.accepted), key=lambda a: a.median_ms or float("inf"))

    def failed(self) -> list[Attempt]:
        return [a for a in self.attempts if not a.accepted]

    def best(self) -> Attempt | None:
        acc = self.accepted()
        return acc[0] if acc else None


def prompt_key(*parts: Any) -> str:
    """A stable hash of everything that determines an answer (model, prompt, settings)."""
    blob = json.dumps(parts, sort_keys=True, default=str, ensure_ascii=False)
    return hashlib.sha256(blob.encode()).hexdigest()


@dataclass
class Answer:
    """A proposer's raw answer, as cached in the trace so a resumed search replays it without new tokens."""

    key: str
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Session:
    """What the search lends a proposer: the answer cache (backed by the trace), the token meter of the budget, and a
    sink for failed attempts. Built by the search; a proposer that needs none of it may ignore it."""

    answers: dict[str, Answer] = field(default_factory=dict)
    record_answer: Callable[[Answer], None] = lambda answer: None
    tokens_limit: int | None = None
    tokens_used: int = 0
    cost_usd: float = 0.0
    failed: Callable[[Idea, str], None] = lambda idea, why: None

    def tokens_left(self) -> int | None:
        return None if self.tokens_limit is None else self.tokens_limit - self.tokens_used

    def cached(self, key: str) -> Answer | None:
        return self.answers.get(key)

    def charge(self, answer: Answer) -> None:
        """Count a fresh answer's tokens and cost, and store it in the cache (and the trace)."""
        self.answers[answer.key] = answer
        self.tokens_used += answer.tokens
        self.cost_usd += answer.cost_usd
        self.record_answer(answer)


@runtime_checkable
class Proposer(Protocol):
    """Ideas first, then implementations of an idea, then repairs of rejected candidates."""

    name: str

    def bind(self, session: Session) -> None:
        """Called once by the search before any other method."""

    def ideas(self, ctx: ProblemContext, history: History, n: int) -> list[Idea]:
        """Up to n new ideas for this problem, conditioned on the history."""

    def implement(self, ctx: ProblemContext, idea: Idea, history: History, n: int) -> list[Candidate]:
        """Up to n candidates implementing the idea; fewer (or none) when an answer had no usable code."""

    def repair(self, ctx: ProblemContext, candidate: Candidate, verdict: Verdict) -> Candidate | None:
        """A fixed version of a rejected candidate, given the harness's reasons and compiler messages; or None."""
