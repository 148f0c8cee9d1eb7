"""The search's budgets and its evaluation of candidates into the archive (an object runner/search/loop.py's search
holds).

Candidates go to the evaluator a chunk at a time (built in parallel, then verified and timed one at a time on each
device: an evaluator over several GPUs shares the chunk among them, runner/harness/gpus.py); a verdict
already in the trace is read back, never redone; every verdict is counted once against the budgets and the progress,
and each candidate becomes an attempt of the archive. The wall and GPU budgets are checked between chunks, and after
the first chunk each holds only as many candidates as the remaining wall budget fits at the seconds per candidate seen
so far. Under a deadline (runner/search/deadline.py) a chunk still running when it is over is cut off
(runner/search/cutoff.py): its candidates evaluated in full by then are archived, the others dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from concurrent.futures import Future

from runner.contract import Candidate, Progress, SearchBudget, Verdict
from runner.search.cutoff import ChunkCutOff, evaluate_until
from runner.search.deadline import Cancelled, Deadline
from runner.search.trace import Trace, candidate_key
from runner.search.types import Attempt, BudgetExhausted, History, Idea, Proposer, Session

# What the confirmation of the finalists costs, in candidate evaluations: each is a fresh process, verified again and
# timed in rounds beside both baselines (about one evaluation for the kernel and one for a PyTorch rewrite).
CONFIRM_EVALUATIONS = 2.0


class Evaluation:
    """The search's budgets and its evaluation of candidates into the archive. The search (runner/search/loop.py) holds
    one, sharing with it the trace, the session (tokens), the history (the archive) and the progress; what is counted
    against the budgets (`counted`, `gpu_seconds`) and each proposer's `wins` are kept here."""

    def __init__(self, *, evaluator: object, budget: SearchBudget, trace: Trace, session: Session, history: History,
                 progress: Progress, on_progress: Callable[[Progress], None], cache: dict[str, Verdict], chunk: int,
                 deadline: Deadline | None) -> None:
        self.evaluator, self.budget, self.trace, self.session = evaluator, budget, trace, session
        self.history, self.progress, self.on_progress = history, progress, on_progress
        self.cache = cache  # candidate_key -> verdict: every verdict this search (or its killed run) got
        self.chunk, self.deadline = chunk, deadline
        self.counted: set[str] = set()  # candidate keys evaluated (or replayed) by this run: the candidates budget
        self.gpu_seconds = 0.0
        self.wins: dict[str, int] = {}  # per proposer: how often its candidate was the fastest verified so far
        self._best_seen: float | None = None
        self._eval_seconds, self._eval_count = 0.0, 0  # spent in the evaluator on fresh candidates, and how many

    # ---- budget ----------------------------------------------------------------------------------------------
    def check_time(self) -> None:
        b = self.budget
        d = self.deadline
        if d is not None and d.cancelled():
            raise Cancelled("cancelled")
        if d is not None and d.left_s() <= 0:
            raise BudgetExhausted("wall", f"the search's share of the budget ({d.seconds:.1f} s) is spent")
        if d is not None and d.left_s() + d.after_s <= CONFIRM_EVALUATIONS * self._seconds_per_candidate():
            raise BudgetExhausted("wall", f"{d.left_s() + d.after_s:.1f} s of the budget are left, what confirming "
                                  "the finalists takes at the seconds per candidate seen")
        if self.trace.elapsed_s() >= b.wall_seconds:
            raise BudgetExhausted("wall", f"{self.trace.elapsed_s():.1f} s of {b.wall_seconds} s")
        if b.gpu_seconds is not None and self.gpu_seconds >= b.gpu_seconds:
            raise BudgetExhausted("gpu", f"{self.gpu_seconds:.1f} s of {b.gpu_seconds} s")

    def check(self, tokens: bool = True) -> None:
        """Raise BudgetExhausted when the next step would exceed the budget; `tokens=False` for a step that spends
        none (evaluating answers already paid for)."""
        b = self.budget
        self.check_time()
        if b.candidates is not None and len(self.counted) >= b.candidates:
            raise BudgetExhausted("candidates", f"{len(self.counted)} of {b.candidates}")
        if tokens and b.tokens is not None and self.session.tokens_used >= b.tokens:
            raise BudgetExhausted("tokens", f"{self.session.tokens_used} of {b.tokens}")

    # ---- evaluation ------------------------------------------------------------------------------------------
    def evaluate(self, batch: list[tuple[Proposer, Idea, Candidate, str | None]], rnd: int) -> list[Attempt]:
        """Evaluate new candidates (replayed verdicts are read back, never redone); archive each as an attempt of
        round `rnd`."""
        self.check(tokens=False)
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
                    self.check_time()
                except BudgetExhausted as e:  # what was evaluated is archived below; the rest is dropped
                    stop = e
                    break
            chunk = todo[start : start + self.chunk_size()]
            start += len(chunk)
            now = self.deadline.clock if self.deadline is not None else self.trace.elapsed_s  # (a test's fake clock)
            t0 = now()
            try:
                verdicts = dict(enumerate(evaluate_until(self.evaluator, [c for _, (_, c) in chunk], self.deadline)))
            except ChunkCutOff as e:  # what was evaluated in full before the cut is archived below; the rest dropped
                verdicts, stop = e.finished, e.stop
            self._eval_seconds += now() - t0
            self._eval_count += len(verdicts)
            for i, v in verdicts.items():
                k, (proposer, c) = chunk[i]
                self.cache[k] = v
                self.trace.write("evaluated", round=rnd, proposer=proposer, key=k, candidate=c.model_dump(),
                                 verdict=v.model_dump())
                self.account(k)
            if stop is not None:
                break
        attempts = []
        for k, (p, idea, c, parent) in zip(keys, batch, strict=True):
            if k not in self.cache:
                continue
            v = self.account(k)
            if v.candidate_id != c.id:
                v = v.model_copy(update={"candidate_id": c.id})
            a = Attempt(round=rnd, proposer=p.name, idea=idea.text, candidate=c, verdict=v, repair_of=parent)
            self.history.attempts.append(a)
            attempts.append(a)
            if a.accepted and a.median_ms is not None and (self._best_seen is None or a.median_ms < self._best_seen):
                self._best_seen = a.median_ms
                self.wins[p.name] = self.wins.get(p.name, 0) + 1
        self.on_progress(self.progress.model_copy())
        if stop is not None:
            raise stop
        return attempts

    def prebuild(self, fut: Future) -> None:
        """An answer's candidates go to the evaluator's builds as soon as it arrives, on the proposer's thread, while
        the harness is still timing the chunk before (an evaluator that builds ahead: runner/harness/prebuild.py)."""
        prebuild = getattr(self.evaluator, "prebuild", None)
        if prebuild is None or fut.cancelled() or fut.exception() is not None:
            return
        value = fut.result()
        candidates = [c for c in (value if isinstance(value, list) else [value]) if isinstance(c, Candidate)]
        if candidates:
            prebuild(candidates)

    def _seconds_per_candidate(self) -> float:
        return self._eval_seconds / self._eval_count if self._eval_count else 0.0

    def chunk_size(self) -> int:
        """As many candidates as the remaining wall budget holds at the seconds per candidate seen so far (at least
        one per device the evaluator spreads a chunk over, at most `chunk`): on a 7 GB problem one candidate costs
        ~25 s to verify, and a full chunk of them ran a 30 s budget to 200 s on the H100. An evaluator over several
        GPUs (runner/harness/gpus.py DeviceSet) says how many as `lanes`; its seconds per candidate are per chunk's
        wall time, so they already count the devices working at once."""
        lanes = max(1, int(getattr(self.evaluator, "lanes", 1)))
        chunk = max(self.chunk, lanes)
        if not self._eval_count:
            return chunk
        per_candidate_s = self._eval_seconds / self._eval_count
        left_s = self.budget.wall_seconds - self.trace.elapsed_s()
        if self.deadline is not None:
            left_s = min(left_s, self.deadline.left_s())
        return max(lanes, min(chunk, int(left_s // max(per_candidate_s, 1e-6))))

    def account(self, key: str) -> Verdict:
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

