"""The search loop: rounds x ideas x implementations, repairs, a beam of the best verified kernels.

    for each round:
        each proposer gives its share of ideas (conditioned on the history), then implementations of each idea
        the harness builds, verifies and times the round's candidates (builds in parallel)
        a rejected candidate goes back to its proposer for repair, up to `max_repairs` times
        the beam keeps the fastest verified kernels; they are what the next round's prompts show
    stop on budget (wall seconds, harness seconds, tokens, candidates), after the last round, or when a round
    (from the second on) does not improve the best time.

Every step is written to the trace as it happens. A search started again on the same trace replays it: proposer
answers come from the trace's answer cache (no new tokens), verdicts from its evaluated records (no new builds), and
the loop continues where the killed one stopped.
"""

from __future__ import annotations

import logging
import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from runner.contract import Candidate, Progress, SearchBudget, Verdict
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

    @property
    def best(self) -> Attempt | None:
        return self.beam[0] if self.beam else None


def shares(total: int, weights: Sequence[float]) -> list[int]:
    """Split `total` branches by weight (largest remainder), deterministically."""
    if not weights or total <= 0:
        return [0] * len(weights)
    s = sum(weights)
    exact = [total * w / s for w in weights]
    out = [int(x) for x in exact]
    for i in sorted(range(len(weights)), key=lambda i: (out[i] - exact[i], i))[: total - sum(out)]:
        out[i] += 1
    return out


def _slug(name: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", name)[:40]


class _Search:
    def __init__(self, ctx, evaluator, proposers, budget, trace_path, progress, min_gain, chunk):
        self.ctx, self.evaluator, self.budget, self.min_gain = ctx, evaluator, budget, min_gain
        self.chunk = max(1, chunk or os.cpu_count() or 1)
        self._eval_seconds = 0.0  # spent in the evaluator on fresh candidates, and how many
        self._eval_count = 0
        self.proposers: list[tuple[Proposer, float]] = [p if isinstance(p, tuple) else (p, 1.0) for p in proposers]
        self.on_progress = progress or (lambda p: None)
        replay = Replay.load(trace_path)
        if replay.context is not None:  # prompts must be byte-identical to the killed run's to replay its answers
            self.ctx = ctx = ProblemContext.model_validate(replay.context)
        self.cache = replay.verdicts  # candidate_key -> verdict: every verdict this search (or its killed run) got
        self.replayed = replay.attempts  # candidate_key -> the killed run's attempt, archived if this run misses it
        self.trace = Trace(trace_path, elapsed_offset_s=replay.elapsed_s)
        self.session = Session(
            answers=dict(replay.answers),
            record_answer=self._record_answer,
            tokens_limit=budget.tokens,
            tokens_used=sum(a.tokens for a in replay.answers.values()),
            cost_usd=sum(a.cost_usd for a in replay.answers.values()),
            failed=self._record_failure,
        )
        self.history = History()
        self.counted: set[str] = set()  # candidate keys evaluated (or replayed) by this run: the candidates budget
        self.gpu_seconds = 0.0
        self.progress = Progress()
        self.disabled: set[str] = set()
        self.round = 0
        started = "resume" if (replay.answers or replay.verdicts) else "start"
        self.trace.write(started, problem=ctx.name, backend=ctx.backend, context=ctx.model_dump(),
                         budget=budget.model_dump(),
                         proposers=[{"name": p.name, "share": w} for p, w in self.proposers])
        for p, _ in self.proposers:
            p.bind(self.session)

    # ---- trace sinks -----------------------------------------------------------------------------------------
    def _record_answer(self, a: Answer) -> None:
        self.trace.write("answer", key=a.key, text=a.text, prompt_tokens=a.prompt_tokens,
                         completion_tokens=a.completion_tokens, cost_usd=a.cost_usd)

    def _record_failure(self, idea: Idea, why: str) -> None:
        self.history.attempts.append(Attempt(round=self.round, proposer=idea.proposer, idea=idea.text, failure=why))
        self.trace.write("failed", round=self.round, proposer=idea.proposer, idea=idea.text, reason=why)

    # ---- budget ----------------------------------------------------------------------------------------------
    def _check_time(self) -> None:
        b = self.budget
        if self.trace.elapsed_s() >= b.wall_seconds:
            raise BudgetExhausted("wall", f"{self.trace.elapsed_s():.1f} s of {b.wall_seconds} s")
        if b.gpu_seconds is not None and self.gpu_seconds >= b.gpu_seconds:
            raise BudgetExhausted("gpu", f"{self.gpu_seconds:.1f} s of {b.gpu_seconds} s")

    def _check(self) -> None:
        b = self.budget
        self._check_time()
        if b.candidates is not None and len(self.counted) >= b.candidates:
            raise BudgetExhausted("candidates", f"{len(self.counted)} of {b.candidates}")
        if b.tokens is not None and self.session.tokens_used >= b.tokens:
            raise BudgetExhausted("tokens", f"{self.session.tokens_used} of {b.tokens}")

    # ---- evaluation ------------------------------------------------------------------------------------------
    def _evaluate(self, batch: list[tuple[Proposer, Idea, Candidate, str | None]]) -> list[Attempt]:
        """Evaluate new candidates (replayed verdicts are read back, never redone); archive each as an attempt."""
        self._check()
        keys = [candidate_key(c) for _, _, c, _ in batch]
        stop: BudgetExhausted | None = None
        limit = self.budget.candidates
        if limit is not None:  # stop before exceeding: evaluate only what fits, in order
            new = list(dict.fromkeys(k for k in keys if k not in self.counted))
            if len(new) > limit - len(self.counted):
                stop = BudgetExhausted("candidates", f"{limit} of {limit}")
            allowed = self.counted | set(new[: limit - len(self.counted)])
            batch = [b for b, k in zip(batch, keys, strict=True) if k in allowed]
            keys = [k for k in keys if k in allowed]
        fresh: dict[str, tuple[str, Candidate]] = {}
        for k, (p, _, c, _) in zip(keys, batch, strict=True):
            if k not in self.cache:
                fresh.setdefault(k, (p.name, c))
        todo = list(fresh.items())
        start = 0
        while start < len(todo):  # builds run in parallel within a chunk; a kill loses one
            if start:
                try:
                    self._check_time()
                except BudgetExhausted as e:  # what was evaluated is archived below; the rest is dropped
                    stop = e
                    break
            chunk = todo[start : start + self._chunk_size()]
            start += len(chunk)
            t0 = self.trace.elapsed_s()
            verdicts = self.evaluator.evaluate_many([c for _, (_, c) in chunk])
            self._eval_seconds += self.trace.elapsed_s() - t0
            self._eval_count += len(chunk)
            for (k, (proposer, c)), v in zip(chunk, verdicts, strict=True):
                self.cache[k] = v
                self.trace.write("evaluated", round=self.round, proposer=proposer, key=k, candidate=c.model_dump(),
                                 verdict=v.model_dump())
                self._account(k)
        attempts = []
        for k, (p, idea, c, parent) in zip(keys, batch, strict=True):
            if k not in self.cache:
                continue
            v = self._account(k)
            if v.candidate_id != c.id:
                v = v.model_copy(update={"candidate_id": c.id})
            a = Attempt(round=self.round, proposer=p.name, idea=idea.text, candidate=c, verdict=v, repair_of=parent)
            self.history.attempts.append(a)
            attempts.append(a)
        self.on_progress(self.progress.model_copy())
        if stop is not None:
            raise stop
        return attempts

    def _chunk_size(self) -> int:
        """As many candidates as the remaining wall budget holds at the seconds per candidate seen so far (at least
        one, at most `chunk`): on a 7 GB problem one candidate costs ~25 s to verify, and a full chunk of them ran a
        30 s budget to 200 s on the H100."""
        if not self._eval_count:
            return self.chunk
        per_candidate_s = self._eval_seconds / self._eval_count
        left_s = self.budget.wall_seconds - self.trace.elapsed_s()
        return max(1, min(self.chunk, int(left_s // max(per_candidate_s, 1e-6))))

    def _account(self, key: str) -> Verdict:
        """Count a verdict once against the budgets and in the progress (fresh or replayed alike)."""
        v = self.cache[key]
        if key not in self.counted:
            self.counted.add(key)
            self.gpu_seconds += v.harness_seconds
            if v.stage != "build" and (v.build is None or v.build.ok):
                self.progress.built += 1
            if v.accepted:
                self.progress.verified += 1
            else:
                self.progress.rejected += 1
        return v

    # ---- one round -------------------------------------------------------------------------------------------
    def _live(self) -> list[tuple[Proposer, float]]:
        return [(p, w) for p, w in self.proposers if p.name not in self.disabled]

    def _call(self, p: Proposer, fn: Callable, *args):
        """Call a proposer; one whose endpoint is gone leaves the search, the others go on."""
        self._check()
        try:
            return fn(*args)
        except ProposerUnavailable as e:
            log.warning("proposer %s is unavailable and leaves the search: %s", p.name, e)
            self.disabled.add(p.name)
            self.trace.write("unavailable", round=self.round, proposer=p.name, reason=str(e))
            return None

    def _round(self) -> None:
        live = self._live()
        batch: list[tuple[Proposer, Idea, Candidate, str | None]] = []
        for (p, _), k in zip(live, shares(self.budget.ideas_per_round, [w for _, w in live]), strict=True):
            if k == 0:
                continue
            ideas = self._call(p, p.ideas, self.ctx, self.history, k) or []
            ideas = [i.model_copy(update={"round": self.round, "proposer": p.name, "index": n})
                     for n, i in enumerate(ideas[:k])]
            self.history.ideas.extend(ideas)
            self.trace.write("ideas", round=self.round, proposer=p.name, ideas=[i.text for i in ideas])
            for idea in ideas:
                n = self.budget.implementations_per_idea
                cands = self._call(p, p.implement, self.ctx, idea, self.history, n) or []
                for j, c in enumerate(cands[:n]):
                    cid = f"r{self.round}-{_slug(p.name)}-i{idea.index}-c{j}"
                    batch.append((p, idea, c.model_copy(update={"id": cid, "idea": idea.text}), None))
        if not batch:
            return
        pending = [a for a in self._evaluate(batch) if not a.accepted]
        for fix in range(1, self.budget.max_repairs + 1):
            repairs = []
            for a in pending:
                p = next(p for p, _ in self.proposers if p.name == a.proposer)
                if p.name in self.disabled or a.candidate is None or a.verdict is None:
                    continue
                c = self._call(p, p.repair, self.ctx, a.candidate, a.verdict)
                if c is not None:
                    root = a.candidate.id.split("-fix")[0]
                    c = c.model_copy(update={"id": f"{root}-fix{fix}", "idea": a.idea, "parent": a.candidate.id})
                    idea = Idea(text=a.idea, proposer=p.name, round=self.round)
                    repairs.append((p, idea, c, a.candidate.id))
            if not repairs:
                break
            pending = [a for a in self._evaluate(repairs) if not a.accepted]

    def _archive_unreached(self) -> None:
        """Archive the killed run's verdicts that this run did not reach (its budget ran out before they were proposed
        again), as they were: the search's best is then the best of everything it evaluated, and it still goes through
        the same beam, and the caller's confirmation, as a kernel found in this run."""
        unreached = [k for k in self.replayed if k not in self.counted]
        for k in unreached:
            self._account(k)
            self.history.attempts.append(self.replayed[k])
        if unreached:
            log.info("archived %d verdict(s) of the resumed trace that this run did not reach", len(unreached))

    def _beam(self) -> list[Attempt]:
        seen, beam = set(), []
        for a in self.history.accepted():
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

    def run(self) -> SearchResult:
        stop = "rounds"
        best_ms: float | None = None
        try:
            for rnd in range(1, self.budget.rounds + 1):
                self.round = rnd
                self.progress.round = self.round
                self._check()
                if not self._live():
                    stop = "no proposer left"
                    break
                self._round()
                beam = self._beam()
                self.history.beam = [a.candidate.id for a in beam if a.candidate]
                new_ms = beam[0].median_ms if beam else None
                improved = new_ms is not None and (best_ms is None or new_ms < best_ms * (1 - self.min_gain))
                if improved:
                    best_ms = new_ms
                self.progress.best_speedup = self._best_speedup(beam[0] if beam else None)
                self.trace.write("round", round=self.round, improved=improved, best_ms=best_ms,
                                 best=beam[0].candidate.id if beam and beam[0].candidate else None)
                self.on_progress(self.progress.model_copy())
                if self.round >= 2 and not improved:
                    stop = "no improvement"
                    break
        except BudgetExhausted as e:
            stop = f"budget: {e}"
            log.info("search stops: %s", e)
        self._archive_unreached()
        beam = self._beam()
        self.progress.best_speedup = self._best_speedup(beam[0] if beam else None)
        self.progress.message = stop
        result = SearchResult(
            history=self.history, beam=beam, stop_reason=stop, rounds=self.round,
            tokens_used=self.session.tokens_used, cost_usd=self.session.cost_usd, gpu_seconds=self.gpu_seconds,
            wall_seconds=self.trace.elapsed_s(), candidates=len(self.counted), progress=self.progress.model_copy(),
        )
        self.trace.write("end", stop_reason=stop, rounds=self.round, tokens=result.tokens_used,
                         cost_usd=result.cost_usd, gpu_seconds=self.gpu_seconds, candidates=result.candidates,
                         best=beam[0].candidate.id if beam and beam[0].candidate else None)
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
) -> SearchResult:
    """Run (or resume, if `trace_path` holds a killed run of the same search) the search; never raises for a bad
    candidate or a bad answer. `proposers` are proposers or (proposer, share) pairs; shares split each round's ideas.
    Candidates go to the evaluator `chunk` at a time (default: one per core, as many as build in parallel), and each
    chunk's verdicts reach the trace before the next starts. A round counts as improving when its best is faster than
    the best so far by more than `min_gain` (a fraction)."""
    return _Search(ctx, evaluator, proposers, budget, trace_path, progress, min_gain, chunk).run()
