"""The search loop: rounds x ideas x implementations, repairs, a beam of the best verified kernels.

    for each round:
        the round's branches are shared among the proposers (rotating: runner/search/pool.py)
        in the first round, builtin proposers (the catalog) go first: their verified kernels are the first beam;
        a proposer of share 0 with a `first_round_ideas` quota (source rewrites) gives that many ideas then, only
        every proposer gives its share of ideas, then implementations of each idea, each call on the proposer's own
        call threads (as many at once as it declares), all of them concurrently
        candidates queue as they arrive; the harness evaluates them (this thread) while calls are still in flight
        a rejected candidate goes back to its proposer for repair as soon as its verdict is in (`max_repairs` times)
        the beam keeps the fastest verified kernels; they are what the next round's prompts show
    stop on budget (wall seconds, harness seconds, tokens, candidates, a deadline), after the last round, or when a
    round (from the second on) does not improve the best time.

Every call of a round sees the same snapshot of the history, taken when the round (or its builtin phase) starts and
put in a canonical order, so prompts do not depend on which answer came first and a resumed search rebuilds them
byte for byte.

Every step is written to the trace as it happens. A search started again on the same trace replays it: proposer
answers come from the trace's answer cache (no new tokens), verdicts from its evaluated records (no new builds), and
the loop continues where the killed one stopped.
"""

from __future__ import annotations

import logging
import os
import re
import time
from collections.abc import Callable, Sequence
from concurrent.futures import FIRST_COMPLETED, Future, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from runner.contract import Candidate, Progress, SearchBudget, Verdict
from runner.search.cutoff import POLL_S
from runner.search.deadline import Deadline
from runner.search.evaluation import Evaluation
from runner.search.pool import CallThreads, Credit, concurrency, is_remote, shares
from runner.search.trace import Replay, Trace, candidate_key
from runner.search.types import (
    Answer,
    Attempt,
    BudgetExhausted,
    History,
    Idea,
    ProblemContext,
    Proposer,
    ProposerUnavailable,
    Session,
    best_baseline_ms,
)

log = logging.getLogger(__name__)


class EvaluatorLike(Protocol):
    """The part of runner.harness.evaluator.Evaluator the search uses."""

    def evaluate_many(self, candidates: list[Candidate]) -> list[Verdict]: ...


@dataclass
class SearchResult:
    history: History
    beam: list[Attempt]
    stop_reason: str
    rounds: int
    tokens_used: int
    cost_usd: float
    gpu_seconds: float
    wall_seconds: float
    candidates: int
    progress: Progress = field(default_factory=Progress)
    credit: list[Credit] = field(default_factory=list)

    @property
    def best(self) -> Attempt | None:
        return self.beam[0] if self.beam else None


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40]


def _order(a: Attempt) -> tuple:
    return a.round, a.proposer, a.candidate.id if a.candidate else "", a.idea, a.failure


def snapshot(history: History) -> History:
    """A copy of the history in a canonical order (not the order answers and verdicts happened to arrive in)."""
    return History(attempts=sorted(list(history.attempts), key=_order),
                   ideas=sorted(list(history.ideas), key=lambda i: (i.round, i.proposer, i.index)),
                   beam=list(history.beam))


@dataclass
class _Ready:
    proposer: Proposer
    idea: Idea
    candidate: Candidate
    parent: str | None
    depth: int  # repairs so far in this candidate's chain


class _Search:
    def __init__(self, ctx, evaluator, proposers, budget, trace_path, progress, min_gain, chunk, gather_s, deadline):
        self.ctx, self.budget, self.min_gain = ctx, budget, min_gain
        self.deadline: Deadline | None = deadline
        self.gather_s = gather_s
        self.proposers: list[tuple[Proposer, float]] = [p if isinstance(p, tuple) else (p, 1.0) for p in proposers]
        replay = Replay.load(trace_path)
        if replay.context is not None:  # prompts must be byte-identical to the killed run's to replay its answers
            self.ctx = ctx = ProblemContext.model_validate(replay.context)
        self.replayed = replay.attempts  # candidate_key -> the killed run's attempt, archived if this run misses it
        self.trace = Trace(trace_path, elapsed_offset_s=replay.elapsed_s)
        self.session = Session(
            answers=dict(replay.answers),
            record_answer=self._record_answer,
            tokens_limit=budget.tokens,
            tokens_used=sum(a.tokens for a in replay.answers.values()),
            cost_usd=sum(a.cost_usd for a in replay.answers.values()),
            failed=self._record_failure,
            max_repairs=budget.max_repairs,
        )
        for a in replay.answers.values():
            self.session.count(a)
        self.history = History()
        self.tokens_spent: BudgetExhausted | None = None  # the token budget ran out: this round's answers are judged
        self.progress = Progress()
        self.on_progress = progress or (lambda p: None)
        self.evaluation = Evaluation(evaluator=evaluator, budget=budget, trace=self.trace, session=self.session,
                                     history=self.history, progress=self.progress, on_progress=self.on_progress,
                                     cache=replay.verdicts, chunk=max(1, chunk or os.cpu_count() or 1),
                                     deadline=deadline)
        self.disabled: set[str] = set()
        self.round = 0
        self.given: dict[str, int] = {}  # branches each proposer was given, over every round
        self.threads: dict[str, tuple[CallThreads, int]] = {}
        self.pending: dict[Future, tuple[str, Proposer, Any, int]] = {}
        self.ready: list[_Ready] = []
        self._ready_since, self._seq = 0.0, 0
        started = "resume" if (replay.answers or replay.verdicts) else "start"
        self.trace.write(started, problem=ctx.name, backend=ctx.backend, context=ctx.model_dump(),
                         budget=budget.model_dump(),
                         proposers=[{"name": p.name, "share": w} for p, w in self.proposers])
        for p, _ in self.proposers:
            p.bind(self.session)

    # ---- trace sinks -----------------------------------------------------------------------------------------
    def _record_answer(self, a: Answer) -> None:
        self.trace.write("answer", key=a.key, text=a.text, prompt_tokens=a.prompt_tokens,
                         completion_tokens=a.completion_tokens, cost_usd=a.cost_usd, model=a.model,
                         finish_reason=a.finish_reason, reasoning_chars=a.reasoning_chars,
                         seconds=round(a.seconds, 3))

    def _record_failure(self, idea: Idea, why: str) -> None:
        self.history.attempts.append(Attempt(round=self.round, proposer=idea.proposer, idea=idea.text, failure=why))
        self.trace.write("failed", round=self.round, proposer=idea.proposer, idea=idea.text, reason=why)

    # ---- proposer calls on their own threads -------------------------------------------------------------------
    def _live(self) -> list[tuple[Proposer, float]]:
        return [(p, w) for p, w in self.proposers if p.name not in self.disabled]

    def _submit(self, kind: str, p: Proposer, fn: Callable, *args: Any, tag: Any = None) -> None:
        """Queue a call of proposer p on its own threads (at most its `max_concurrency` at once). Once the tokens
        are spent, no call is made, and the answers already in are still evaluated before the search stops."""
        try:
            self.evaluation.check()
        except BudgetExhausted as e:
            if e.resource != "tokens":
                raise
            self.tokens_spent = self.tokens_spent or e
            return
        if p.name not in self.threads:
            self.threads[p.name] = (CallThreads(concurrency(p), f"proposer-{_slug(p.name)}"), concurrency(p))
        self._seq += 1
        self.pending[fut := self.threads[p.name][0].submit(fn, *args)] = (kind, p, tag, self._seq)
        if kind in ("implement", "repair"):  # its candidates build while the harness times the chunk before
            fut.add_done_callback(self.evaluation.prebuild)

    def _handle(self, fut: Future, seen: History) -> None:
        kind, p, tag, _ = self.pending.pop(fut)
        try:
            value = fut.result()
        except BudgetExhausted as e:  # the request would not fit the tokens left: the others' answers are still judged
            if e.resource != "tokens":
                raise
            self.tokens_spent = self.tokens_spent or e
            return
        except ProposerUnavailable as e:
            if p.name not in self.disabled:
                log.warning("proposer %s is unavailable and leaves the search: %s", p.name, e)
                self.disabled.add(p.name)
                self.trace.write("unavailable", round=self.round, proposer=p.name, reason=str(e))
            return
        if kind == "ideas":
            ideas = [i.model_copy(update={"round": self.round, "proposer": p.name, "index": n})
                     for n, i in enumerate((value or [])[:tag])]
            self.history.ideas.extend(ideas)
            self.trace.write("ideas", round=self.round, proposer=p.name, ideas=[i.text for i in ideas])
            n = self.budget.implementations_per_idea
            for idea in ideas:
                self._submit("implement", p, p.implement, self.ctx, idea, seen, n, tag=idea)
        elif kind == "implement":
            idea = tag
            for j, c in enumerate((value or [])[: self.budget.implementations_per_idea]):
                cid = f"r{self.round}-{_slug(p.name)}-i{idea.index}-c{j}"
                self._queue(_Ready(p, idea, c.model_copy(update={"id": cid, "idea": idea.text}), None, 0))
        elif kind == "repair" and value is not None:
            a, depth = tag
            root = a.candidate.id.split("-fix")[0]
            c = value.model_copy(update={"id": f"{root}-fix{depth}", "idea": a.idea, "parent": a.candidate.id})
            self._queue(_Ready(p, Idea(text=a.idea, proposer=p.name, round=self.round), c, a.candidate.id, depth))

    def _queue(self, r: _Ready) -> None:
        if not self.ready:
            self._ready_since = time.monotonic()
        self.ready.append(r)

    def _harvest(self, seen: History, block: bool) -> None:
        """Handle every finished call, in the order they were made; with `block`, first wait for the next one (or
        until the oldest queued candidate has waited `gather_s`)."""
        if block and self.pending:
            timeout = None if not self.ready else max(0.0, self._ready_since + self.gather_s - time.monotonic())
            if self.deadline is not None:  # a cancel or the deadline is noticed while a model is still thinking
                timeout = POLL_S if timeout is None else min(timeout, POLL_S)
            wait(list(self.pending), timeout=timeout, return_when=FIRST_COMPLETED)
        for fut in sorted((f for f in self.pending if f.done()), key=lambda f: self.pending[f][3]):
            self._handle(fut, seen)

    def _due(self) -> bool:
        """Evaluate now: a chunk is full, nothing more is coming, or the oldest candidate waited long enough."""
        return bool(self.ready) and (len(self.ready) >= self.evaluation.chunk_size() or not self.pending
                                     or time.monotonic() - self._ready_since >= self.gather_s)

    def _run(self, group: list[tuple[Proposer, int]]) -> None:
        """Ideas, implementations and repairs of these proposers, concurrently, with the harness evaluating what is
        ready while calls are still in flight."""
        seen = snapshot(self.history)
        self.pending, self.ready = {}, []
        for p, k in group:
            self._submit("ideas", p, p.ideas, self.ctx, seen, k, tag=k)
        while self.pending or self.ready:
            if self.deadline is not None:
                self.evaluation.check_time()
            self._harvest(seen, block=not self._due())
            if not self._due():
                continue
            take, self.ready = self.ready[: self.evaluation.chunk_size()], self.ready[self.evaluation.chunk_size():]
            self._ready_since = time.monotonic()
            depth = {r.candidate.id: r.depth for r in take}
            attempts = self.evaluation.evaluate([(r.proposer, r.idea, r.candidate, r.parent) for r in take], self.round)
            for a in attempts:
                p = next(p for p, _ in self.proposers if p.name == a.proposer)
                d = depth.get(a.candidate.id, 0) if a.candidate else 0
                if (not a.accepted and a.candidate is not None and a.verdict is not None and p.name not in
                        self.disabled and d < self.budget.max_repairs):
                    self._submit("repair", p, p.repair, self.ctx, a.candidate, a.verdict, tag=(a, d + 1))

    def _round(self) -> None:
        live = self._live()
        alloc = shares(self.budget.ideas_per_round, [w for _, w in live], [self.given.get(p.name, 0) for p, _ in live])
        group = [(p, k) for (p, _), k in zip(live, alloc, strict=True) if k]
        if self.round == 1:  # a proposer with a first-round quota (source rewrites) runs beside the catalog, unshared
            group += [(p, q) for p, w in live if not w and (q := int(getattr(p, "first_round_ideas", 0) or 0))]
        for p, k in group:
            self.given[p.name] = self.given.get(p.name, 0) + k
        builtin = [(p, k) for p, k in group if not is_remote(p)]
        if self.round == 1 and builtin and len(builtin) < len(group):  # the catalog's kernels are the first beam
            self._run(builtin)
            self.history.beam = [a.candidate.id for a in self._beam() if a.candidate]
            group = [(p, k) for p, k in group if is_remote(p)]
        self._run(group)

    def _archive_unreached(self) -> None:
        """Archive the killed run's verdicts that this run did not reach (its budget ran out before they were proposed
        again), as they were: the search's best is then the best of everything it evaluated, and it still goes through
        the same beam, and the caller's confirmation, as a kernel found in this run."""
        unreached = [k for k in self.replayed if k not in self.evaluation.counted]
        for k in unreached:
            self.evaluation.account(k)
            self.history.attempts.append(self.replayed[k])
        if unreached:
            log.info("archived %d verdict(s) of the resumed trace that this run did not reach", len(unreached))

    def _beam(self) -> list[Attempt]:
        seen, beam = set(), []
        for a in snapshot(self.history).accepted():
            k = candidate_key(a.candidate) if a.candidate else ""
            if k not in seen:
                seen.add(k)
                beam.append(a)
        return beam[: self.budget.beam]

    def _best_speedup(self, best: Attempt | None) -> float | None:
        """Speedup of the best kernel over the faster of eager and torch.compile."""
        if best is None or best.median_ms is None or best.verdict is None:
            return None
        base = self.ctx.baseline_best_ms
        if base is None and best.verdict.baselines is not None:
            base = best_baseline_ms(best.verdict.baselines)
        return base / best.median_ms if base is not None and best.median_ms > 0 else best.verdict.speedup_vs_eager

    def credit(self, best: Attempt | None) -> list[Credit]:
        out = []
        for p, w in self.proposers:
            u = self.session.usage.get(p.name)
            mine = [a for a in self.history.attempts if a.proposer == p.name]
            if not w and not mine and not any(i.proposer == p.name for i in self.history.ideas):
                continue  # a proposer of share 0 with nothing to propose here (no source rewrite) is not news
            out.append(Credit(
                name=p.name, share=w, requests=u.requests if u else 0, tokens=u.tokens if u else 0,
                cost_usd=u.cost_usd if u else 0.0, seconds=u.seconds if u else 0.0,
                ideas=sum(1 for i in self.history.ideas if i.proposer == p.name),
                candidates=sum(1 for a in mine if a.candidate is not None), verified=sum(1 for a in mine if a.accepted),
                wins=self.evaluation.wins.get(p.name, 0), best=best is not None and best.proposer == p.name))
        return out

    def run(self) -> SearchResult:
        stop = "rounds"
        best_ms: float | None = None
        try:
            for rnd in range(1, self.budget.rounds + 1):
                self.round = rnd
                self.progress.round = self.round
                self.evaluation.check()
                self.on_progress(self.progress.model_copy())  # the round shows as it starts, not after its first chunk
                if not self._live():
                    stop = "no proposer left"
                    break
                self._round()
                if self.tokens_spent is not None:
                    raise self.tokens_spent
                beam = self._beam()
                self.history.beam = [a.candidate.id for a in beam if a.candidate]
                new_ms = beam[0].median_ms if beam else None
                improved = new_ms is not None and (best_ms is None or new_ms < best_ms * (1 - self.min_gain))
                if improved:
                    best_ms = new_ms
                self.progress.best_speedup = self._best_speedup(beam[0] if beam else None)
                self.trace.write("round", round=self.round, improved=improved, best_ms=best_ms,
                                 best=beam[0].candidate.id if beam and beam[0].candidate else None,
                                 credit=[c.as_dict() for c in self.credit(beam[0] if beam else None)])
                self.on_progress(self.progress.model_copy())
                if self.round >= 2 and not improved:
                    stop = "no improvement"
                    break
        except BudgetExhausted as e:
            stop = f"budget: {e}"
            log.info("search stops: %s", e)
        finally:
            for threads, size in self.threads.values():
                threads.close(size)
        self._archive_unreached()
        beam = self._beam()
        self.progress.best_speedup = self._best_speedup(beam[0] if beam else None)
        self.progress.message = stop
        credit = self.credit(beam[0] if beam else None)
        result = SearchResult(
            history=self.history, beam=beam, stop_reason=stop, rounds=self.round,
            tokens_used=self.session.tokens_used, cost_usd=self.session.cost_usd, gpu_seconds=self.evaluation.gpu_seconds,
            wall_seconds=self.trace.elapsed_s(), candidates=len(self.evaluation.counted), progress=self.progress.model_copy(),
            credit=credit,
        )
        self.trace.write("end", stop_reason=stop, rounds=self.round, tokens=result.tokens_used,
                         cost_usd=result.cost_usd, gpu_seconds=self.evaluation.gpu_seconds, candidates=result.candidates,
                         best=beam[0].candidate.id if beam and beam[0].candidate else None,
                         credit=[c.as_dict() for c in credit])
        self.on_progress(self.progress.model_copy())
        self.trace.close()
        return result


def search(
    ctx: ProblemContext,
    evaluator: EvaluatorLike,
    proposers: Sequence[Proposer | tuple[Proposer, float]],
    budget: SearchBudget,
    trace_path: Path,
    *,
    progress: Callable[[Progress], None] | None = None,
    min_gain: float = 0.01,
    chunk: int | None = None,
    gather_s: float = 1.0,
    deadline: Deadline | None = None,
) -> SearchResult:
    """Run (or resume, if `trace_path` holds a killed run of the same search) the search; never raises for a bad
    candidate or a bad answer. `proposers` are proposers or (proposer, share) pairs; shares split each round's ideas.
    Candidates go to the evaluator as they arrive, up to `chunk` at a time (default: one per core, as many as build
    in parallel): a chunk goes when it is full, when no call is still in flight, or when its first candidate has
    waited `gather_s` seconds for others to build beside it. Each chunk's verdicts reach the trace before the next
    starts. A round counts as improving when its best is faster than the best so far by more than `min_gain`. A
    `deadline` (runner/search/deadline.py) ends it when over, cutting off the chunk in evaluation (cancelled: raises
    `Cancelled`)."""
    return _Search(ctx, evaluator, proposers, budget, trace_path, progress, min_gain, chunk, gather_s, deadline).run()
