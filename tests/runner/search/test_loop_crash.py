"""The search loop around a crashing kernel, with the real harness: on the CPU a segfault, on the GPU (skipped
without one) a kernel that writes out of bounds. The crasher is a `crash` verdict in the trace, the search finishes
with the honest kernel beside it as its best, and a resume of the killed search does not evaluate the crasher
again."""

from __future__ import annotations

import json

import pytest

from runner.contract import Candidate, SearchBudget
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.search.loop import search
from runner.search.trace import read_events
from runner.search.types import Idea, ProblemContext, Session

from ..adversarial import FAST_HACKS, HONEST_FAST
from ..adversarial_cuda import HONEST_FAST_CU, OOB_KB_CUDA
from ..conftest import FAST_TIMER, scale_relu_spec

# backend: (the crasher, its format, the honest kernel)
KERNELS = {"cpu": (FAST_HACKS["segfault"][0], "fast", HONEST_FAST), "cuda": (OOB_KB_CUDA, "kernelbench", HONEST_FAST_CU)}


class TwoKernels:
    """One idea a round, implemented as the crasher and an honest kernel; no repairs."""

    name = "scripted"

    def __init__(self, backend: str):
        self.backend = backend

    def bind(self, session: Session) -> None:
        self.session = session

    def ideas(self, ctx, history, n):
        r = len({i.round for i in history.ideas}) + 1
        return [Idea(text=f"fuse scale, bias and relu (round {r}, {k})", round=r) for k in range(n)]

    def implement(self, ctx, idea, history, n):
        crasher, fmt, honest = KERNELS[self.backend]
        return [Candidate(id="crasher", format=fmt, backend=self.backend, sources=crasher),
                Candidate(id="honest", format="fast", backend=self.backend, sources=honest)]

    def repair(self, ctx, candidate, verdict):
        return None


class Counting:
    """The real evaluator, counting what reaches it."""

    def __init__(self, ev: Evaluator):
        self.ev, self.seen = ev, []

    def __getattr__(self, name):
        return getattr(self.ev, name)

    def evaluate_many(self, candidates):
        self.seen += [c.id for c in candidates]
        return self.ev.evaluate_many(candidates)


@pytest.mark.parametrize("backend", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def test_a_search_around_a_crashing_kernel_finishes_and_its_resume_skips_the_crasher(tmp_path, backend):
    ctx = ProblemContext(name="scale_relu", reference_source="class Model: ...", backend=backend)
    honest = KERNELS[backend][2]
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=tmp_path / "cache")
    budget = SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=2, max_repairs=0)
    trace = tmp_path / "trace.jsonl"
    with Evaluator(scale_relu_spec(), backend=backend, config=cfg) as ev:
        res = search(ctx, Counting(ev), [TwoKernels(backend)], budget, trace, chunk=2)
        assert res.stop_reason and res.candidates == 2
        crashed = [a for a in res.history.attempts if a.verdict and not a.verdict.accepted]
        assert len(crashed) == 1 and any(r.startswith("crash") for r in crashed[0].reasons), crashed
        assert res.best is not None and res.best.candidate.sources == honest
        assert [e["event"] for e in read_events(trace)].count("evaluated") == 2
        # killed after the crasher's verdict reached the trace: the resume evaluates only what came after it
        lines = trace.read_text().splitlines()
        first = next(i for i, x in enumerate(lines) if json.loads(x)["event"] == "evaluated"
                     and not json.loads(x)["verdict"]["accepted"])
        trace.write_text("\n".join(lines[: first + 1]) + "\n")
        again = Counting(ev)
        resumed = search(ctx, again, [TwoKernels(backend)], budget, trace, chunk=2)
    crasher_id = json.loads(lines[first])["candidate"]["id"]
    assert crasher_id not in again.seen and len(again.seen) <= 1, again.seen
    assert resumed.best is not None and resumed.best.candidate.sources == honest
