"""The pool of proposers: how each round's branches are shared, what each proposer is credited with, and the
threads that call proposers while the harness evaluates.

Shares rotate: `shares(total, weights, given)` hands out a round's branches one at a time to the proposer whose weight
per branch already given (over every round so far) is highest (Sainte-Laguë's divisors), so two branches a round
among three equal models go [1, 1, 0], then [1, 0, 1], then [0, 1, 1]: every model gets its turns.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future
from dataclasses import asdict, dataclass
from typing import Any

log = logging.getLogger(__name__)


def shares(total: int, weights: Sequence[float], given: Sequence[int] | None = None) -> list[int]:
    """Split `total` branches by weight, continuing from `given` (each proposer's branches in earlier rounds):
    deterministic, and over rounds each proposer's count follows its weight. Ties go to the earlier proposer."""
    n = len(weights)
    out = [0] * n
    if not n or total <= 0:
        return out
    before = list(given) if given is not None else [0] * n
    for _ in range(total):
        best = max(range(n), key=lambda i: (weights[i] / (before[i] + out[i] + 0.5) if weights[i] > 0 else -1.0, -i))
        if weights[best] <= 0:
            break
        out[best] += 1
    return out


@dataclass
class Credit:
    """What one proposer spent and brought: requests, tokens, cost (where the endpoint's price is configured), the
    seconds its requests took, its ideas and candidates, how many were verified, and its wins (verified candidates
    that were faster than every candidate verified before them)."""

    name: str
    share: float = 1.0
    requests: int = 0
    tokens: int = 0
    cost_usd: float = 0.0
    seconds: float = 0.0
    ideas: int = 0
    candidates: int = 0
    verified: int = 0
    wins: int = 0
    best: bool = False  # holds the search's best kernel

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["seconds"] = round(d["seconds"], 3)
        return d

    def yield_text(self) -> str:
        per_kt = f", {self.verified / (self.tokens / 1000):.2f} verified per 1k tokens" if self.tokens else ""
        return f"{self.verified} verified of {self.candidates}{per_kt}"


def is_remote(proposer: object) -> bool:
    """A proposer that answers over the network (an LLM) rather than from builtin code: builtin proposers run
    first in the first round, so that their verified kernels are the first beam the models see."""
    return bool(getattr(proposer, "remote", False))


def concurrency(proposer: object) -> int:
    """How many calls of this proposer may run at once: its `max_concurrency`, else one (a proposer that declares
    nothing is called one call at a time)."""
    return max(1, int(getattr(proposer, "max_concurrency", 1) or 1))


class CallThreads:
    """A fixed set of daemon threads running submitted calls, as futures. Daemon threads: a search that stops (its
    budget spent) does not wait for a model still thinking, nor does the process at exit; the late answer is
    dropped."""

    def __init__(self, size: int, name: str):
        self._q: queue.SimpleQueue = queue.SimpleQueue()
        self._closed = False
        for k in range(max(1, size)):
            threading.Thread(target=self._work, name=f"{name}-{k}", daemon=True).start()

    def _work(self) -> None:
        while True:
            item = self._q.get()
            if item is None:
                return
            fut, fn, args = item
            if not fut.set_running_or_notify_cancel():
                continue
            try:
                fut.set_result(fn(*args))
            except BaseException as e:  # noqa: BLE001 - handed to whoever waits on the future
                fut.set_exception(e)

    def submit(self, fn: Callable, *args: Any) -> Future:
        fut: Future = Future()
        if self._closed:
            fut.cancel()
        else:
            self._q.put((fut, fn, args))
        return fut

    def close(self, size: int) -> None:
        """Stop taking calls; queued ones are cancelled as their thread reaches them, running ones finish alone."""
        self._closed = True
        while True:
            try:
                item = self._q.get_nowait()
            except queue.Empty:
                break
            if item is not None:
                item[0].cancel()
        for _ in range(size):
            self._q.put(None)


def credit_markdown(credit: Sequence[Credit]) -> str:
    """A table of what each proposer spent and brought, for report.md and the PR's folded details."""
    if not credit:
        return ""
    rows = ["| proposer | share | requests | tokens | cost | request s | ideas | candidates | verified | wins |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for c in credit:
        cost = f"${c.cost_usd:.4f}" if c.cost_usd else "-"
        rows.append(f"| {c.name}{' (best)' if c.best else ''} | {c.share:g} | {c.requests} | {c.tokens} | {cost} | "
                    f"{c.seconds:.1f} | {c.ideas} | {c.candidates} | {c.verified} | {c.wins} |")
    return "\n".join(rows)
