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
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from runner.contract import Backend, Baselines, Candidate, Roofline, Verdict, faster_baseline


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
    """What is known about the target device. Ceilings are measured where the harness measured them; limits are the
    device's own (torch.cuda.get_device_properties), None where unknown."""

    name: str
    specs: str = ""  # e.g. "132 SMs, 50 MB L2, 80 GB HBM3"
    copy_bandwidth_bytes_per_s: float | None = None
    notes: str = ""
    cuda_arch: str | None = None  # e.g. "sm_90"
    sm_count: int | None = None
    smem_per_block_bytes: int | None = None  # the opt-in maximum (cudaFuncSetAttribute) where known
    smem_per_sm_bytes: int | None = None
    regs_per_sm: int | None = None
    max_threads_per_sm: int | None = None
    l2_bytes: int | None = None


class TensorInfo(_Data):
    """One fast-format argument as the kernel receives it (fusebot.h's fb_tensor)."""

    name: str  # "x" (a forward argument) or "weight" (a state_dict entry)
    shape: list[int]
    dtype: str  # "float32"
    strides: list[int]  # in elements
    role: str = "input"  # "input", "param" or "output"


class InputSet(_Data):
    """The arguments and outputs of one verified shape set (0: the problem's inputs, 1: its second shape)."""

    shape_set: int
    tensors: list[TensorInfo] = Field(default_factory=list)


class ProblemContext(_Data):
    """Everything a proposer may know about the problem: never anything the harness keeps secret."""

    name: str
    reference_source: str
    backend: Backend = "cuda"
    format: str = "fast"  # what `implement` must produce: "fast" (C ABI) or "kernelbench" (ModelNew)
    input_summary: str = ""  # e.g. "x: float32[16, 16384]"
    inputs: list[InputSet] = Field(default_factory=list)  # every shape set the harness verifies on
    gpu: GpuInfo | None = None
    roofline: Roofline | None = None
    baselines: Baselines | None = None

    @property
    def baseline_best_ms(self) -> float | None:
        return best_baseline_ms(self.baselines)


def best_baseline_ms(baselines: Baselines | None) -> float | None:
    """The faster of eager and torch.compile: the time a kernel must beat."""
    fb = faster_baseline(baselines)
    return fb[1].median_ms if fb else None


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
    """A proposer's raw answer, as cached in the trace so a resumed search replays it without new tokens.
    `finish_reason` is the endpoint's ("stop", "length", "content_filter"); `reasoning_chars` counts reasoning the
    endpoint returned beside the content (a reasoning model that spent its budget thinking answers with it alone)."""

    key: str
    text: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    cost_usd: float = 0.0
    model: str = ""
    finish_reason: str = "stop"
    reasoning_chars: int = 0
    seconds: float = 0.0

    @property
    def tokens(self) -> int:
        return self.prompt_tokens + self.completion_tokens


@dataclass
class Usage:
    """What one proposer's answers cost."""

    requests: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0  # wall seconds its requests took, summed (concurrent requests each count)


@dataclass
class Session:
    """What the search lends a proposer: the answer cache (backed by the trace), the token meter of the budget, and a
    sink for failed attempts. Built by the search; a proposer that needs none of it may ignore it. Thread-safe: a
    proposer's calls may run concurrently, and the token budget is reserved before a request is sent, so concurrent
    requests never overshoot it together."""

    answers: dict[str, Answer] = field(default_factory=dict)
    record_answer: Callable[[Answer], None] = lambda answer: None
    tokens_limit: int | None = None
    tokens_used: int = 0
    cost_usd: float = 0.0
    failed: Callable[[Idea, str], None] = lambda idea, why: None
    max_repairs: int = 4  # repairs of one candidate, for a proposer that repairs its own answers (no code, cut off)
    usage: dict[str, Usage] = field(default_factory=dict)  # by model
    reserved: int = 0
    _cond: threading.Condition = field(default_factory=threading.Condition, repr=False)

    def tokens_left(self) -> int | None:
        return None if self.tokens_limit is None else self.tokens_limit - self.tokens_used - self.reserved

    def cached(self, key: str) -> Answer | None:
        return self.answers.get(key)

    def reserve(self, need: int, want: int) -> int:
        """Reserve room for a request: at least `need` tokens, up to `want`; returns what was reserved. Waits while
        requests in flight hold the room it needs; raises BudgetExhausted when even with none in flight it does not
        fit."""
        with self._cond:
            while True:
                if self.tokens_limit is None:
                    return want
                free = self.tokens_limit - self.tokens_used - self.reserved
                if free >= need:
                    got = min(want, free)
                    self.reserved += got
                    return got
                if not self.reserved:
                    raise BudgetExhausted("tokens", f"{self.tokens_used} used of {self.tokens_limit}, the next "
                                          f"request needs about {need}")
                self._cond.wait()

    def release(self, tokens: int) -> None:
        with self._cond:
            self.reserved = max(0, self.reserved - tokens) if self.tokens_limit is not None else 0
            self._cond.notify_all()

    def charge(self, answer: Answer) -> None:
        """Count a fresh answer's tokens and cost, and store it in the cache (and the trace)."""
        with self._cond:
            self.answers[answer.key] = answer
            self.tokens_used += answer.tokens
            self.cost_usd += answer.cost_usd
            self.count(answer)
            self.record_answer(answer)
            self._cond.notify_all()

    def count(self, answer: Answer) -> None:
        """Credit an answer (fresh or replayed) to its model."""
        u = self.usage.setdefault(answer.model, Usage())
        u.requests += 1
        u.tokens += answer.tokens
        u.cost_usd += answer.cost_usd
        u.seconds += answer.seconds


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
