"""On the GPU (skipped without one): the catalog and two scripted models answering after a simulated latency (each
answer a distinct, correct kernel); prints candidates per hour of wall time and the share of wall time the harness was evaluating.
Run on the device: `FUSEBOT_TEST_LLM_LATENCY_S=30 python -m pytest -q -s -m gpu
tests/runner/proposers/llm/test_overlap_gpu.py`."""

from __future__ import annotations

import os
import time

import pytest

from runner.contract import ProblemSpec, SearchBudget
from runner.harness.evaluator import Evaluator
from runner.pipeline import make_proposers, problem_context
from runner.search.loop import search
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.cuda_kernels import PROBLEM, VEC4, answer
from tests.runner.llm_helpers import IDEAS, SECRET
from tests.runner.proposers.llm.test_overlap import Clocked
from tests.runner.proposers.llm.test_proposer import IDEAS_T, IMPL_T

pytestmark = pytest.mark.gpu


def test_the_gpu_evaluates_while_the_models_think(tmp_path, monkeypatch):
    latency_s = float(os.environ.get("FUSEBOT_TEST_LLM_LATENCY_S", "30"))
    script = [Reply(IDEAS, match=IDEAS_T, delay_s=latency_s),
              Reply(answer(VEC4, "request {request}"), match=IMPL_T, delay_s=latency_s)]
    spec = ProblemSpec(name=PROBLEM.stem, path=str(PROBLEM))
    with Evaluator(spec, backend="cuda") as real, ScriptedLLM(script) as srv:
        for k, v in {"FUSEBOT_LLM_BASE_URL": srv.url, "FUSEBOT_LLM_API_KEY": SECRET,
                     "FUSEBOT_LLM_TIMEOUT_S": str(latency_s * 3)}.items():
            monkeypatch.setenv(k, v)
        pool = make_proposers(["model-a", "model-b"])
        ctx = problem_context(spec, real, "cuda", describe=True)
        ev = Clocked(real)
        t0 = time.time()
        res = search(ctx, ev, pool, SearchBudget(rounds=2, ideas_per_round=6, implementations_per_idea=2,
                                                  wall_seconds=1800), tmp_path / "trace.jsonl")
        wall_s = time.time() - t0
    busy_s = sum(end - start for start, end, _ in ev.batches)
    print(f"{res.candidates} candidates in {wall_s:.0f} s of wall: {res.candidates / wall_s * 3600:.0f} an hour; "
          f"the harness evaluated {busy_s:.0f} s ({100 * busy_s / wall_s:.0f}% of the wall); "
          f"{len(srv.completions())} requests at {latency_s:.0f} s each; stop: {res.stop_reason}")
    for c in res.credit:
        print(c.as_dict())
    in_flight = [r for r in srv.completions() if r.done_at - r.at >= latency_s]
    overlapped = [b for b in ev.batches if any(r.at < b[0] < r.done_at for r in in_flight)]
    assert overlapped, "no evaluation ran while a request was in flight"
    assert {c.name for c in res.credit if c.candidates} >= {"catalog", "model-a", "model-b"}
