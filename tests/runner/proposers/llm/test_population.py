"""One population: the builtin catalog beside every configured model, the catalog's kernels the first beam the models
see; over real HTTP to the scripted server."""

from __future__ import annotations

import pytest

from runner.contract import Candidate, SearchBudget
from runner.errors import UsageError
from runner.pipeline import make_proposers
from runner.proposers.catalog import CatalogProposer
from runner.proposers.llm.proposer import LLMProposer, llm_proposers
from runner.proposers.rewrite.proposer import RewriteProposer
from runner.results.outcome import outcome, report_markdown
from runner.search.loop import search
from runner.search.types import Idea
from tests.fakes.evaluators import TableEvaluator
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.llm_helpers import IDEAS, code_answer, settings
from tests.runner.proposers.llm.test_proposer import CTX, IDEAS_T, IMPL_T


class Builtin:
    """A builtin proposer (no `remote`): one kernel per idea, 0.6 ms."""

    name = "catalog"

    def bind(self, session):
        pass

    def ideas(self, ctx, history, n):
        return [Idea(text=f"builtin template {k}") for k in range(n)]

    def implement(self, ctx, idea, history, n):
        return [Candidate(id="x", format="fast", backend="cpu",
                          sources={"kernel.cpp": f"// FAKE: ms=0.6\n// CATALOG-KERNEL {idea.text}\n"})]

    def repair(self, ctx, candidate, verdict):
        return None


def test_with_models_configured_the_catalog_joins_the_pool_first(monkeypatch):
    for k in ("FUSEBOT_LLM_MODELS", "FUSEBOT_LLM_API_KEY"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.delenv("FUSEBOT_LLM_BASE_URL", raising=False)
    alone = make_proposers([])
    assert [type(p) for p, _ in alone] == [CatalogProposer, RewriteProposer]
    monkeypatch.setenv("FUSEBOT_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("FUSEBOT_LLM_API_KEY", "sk-real")
    pool = make_proposers(["m-1:2", "m-2"])
    assert [(p.name, w) for p, w in pool] == [("catalog", 1.0), ("rewrite", 0.0), ("m-1", 2.0), ("m-2", 1.0)]
    assert isinstance(pool[0][0], CatalogProposer) and all(isinstance(p, LLMProposer) for p, _ in pool[2:])


def test_the_catalogs_verified_kernels_are_the_first_beam_the_model_sees(tmp_path):
    script = [Reply(IDEAS, match=IDEAS_T), Reply(code_answer("ms=0.3"), match=IMPL_T)]
    ev = TableEvaluator()
    with ScriptedLLM(script) as srv:
        pool = [(Builtin(), 1.0), *llm_proposers(settings(srv.url))]
        res = search(CTX, ev, pool, SearchBudget(rounds=1, ideas_per_round=2, implementations_per_idea=1),
                     tmp_path / "t.jsonl")
    first = srv.completions()[0]
    assert IDEAS_T in first.text and "### Best 1: 0.6 ms" in first.text and "CATALOG-KERNEL" in first.text
    assert ev.evaluated[0].id.startswith("r1-catalog-")  # evaluated before the model was asked
    assert res.best.proposer == "scripted-a" and res.best.median_ms == 0.3
    assert {c.name: c.verified for c in res.credit} == {"catalog": 1, "scripted-a": 1}
    report = report_markdown(outcome("relu2", res, CTX.baselines, CTX.roofline))
    assert "| scripted-a (best) | 1 | 2 | 600 | - |" in report and "| catalog | 1 | 0 | 0 | - |" in report, report[-900:]


def test_no_builtin_leaves_the_models_alone_and_needs_one(monkeypatch):
    monkeypatch.delenv("FUSEBOT_LLM_BASE_URL", raising=False)
    with pytest.raises(UsageError, match="no proposer"):
        make_proposers([], builtin=False)
    monkeypatch.setenv("FUSEBOT_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("FUSEBOT_LLM_API_KEY", "sk-real")
    assert [p.name for p, _ in make_proposers(["m-1"], builtin=False)] == ["m-1"]
