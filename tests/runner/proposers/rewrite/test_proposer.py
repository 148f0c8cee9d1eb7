"""The source-rewrite proposer (runner/proposers/rewrite/proposer.py): ideas and KernelBench candidates from the
user's module file, nothing for a module with nothing to rewrite, its first-round quota in the search, and the rewrite of
examples/row_gain.py verified by the real harness on the CPU."""

from __future__ import annotations

import logging
import types
from pathlib import Path

import torch

from runner.contract import ProblemSpec, SearchBudget
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import kernelbench_aliases
from runner.proposers.rewrite.proposer import (
    ALIASES_MARK,
    CANDIDATE_FILE,
    RewriteProposer,
    split_reference,
    target_class,
)
from runner.search.loop import search
from runner.search.types import Attempt, History, Idea, ProblemContext
from tests.fakes.evaluators import TableEvaluator

from ...conftest import FAST_TIMER
from .test_rules import changed, module

ROOT = Path(__file__).resolve().parents[4]
ROW_GAIN = ROOT / "examples" / "row_gain.py"


def row_gain_spec() -> ProblemSpec:
    return ProblemSpec(name="row_gain", path=str(ROW_GAIN), class_name="RowGain", second_inputs="get_second_inputs")


def context(source: str, backend: str = "cpu") -> ProblemContext:
    return ProblemContext(name="t", reference_source=source, backend=backend)


def test_the_pipelines_alias_block_is_split_off_and_names_the_class():
    spec = row_gain_spec()
    aliases = kernelbench_aliases(spec)
    assert aliases.startswith(ALIASES_MARK)
    text = ROW_GAIN.read_text()
    assert split_reference(text + aliases) == (text, aliases)
    assert target_class(aliases) == "RowGain"
    with_kwargs = kernelbench_aliases(spec.model_copy(update={"init_kwargs": {"rows": 4}}))
    assert target_class(with_kwargs) == "RowGain"
    assert split_reference(text) == (text, "") and target_class("") == "Model"


def test_row_gain_becomes_one_idea_and_one_kernelbench_candidate_that_computes_the_same():
    text = ROW_GAIN.read_text()
    ctx = context(text + kernelbench_aliases(row_gain_spec()))
    prop = RewriteProposer()
    (idea,) = prop.ideas(ctx, History(), 8)
    assert "`torch.diag(self.gain) @ x` -> `self.gain[:, None] * x if x.dim() >= 2" in idea.text
    assert "no kernel" in idea.text
    (c,) = prop.implement(ctx, idea, History(), 2)
    assert c.format == "kernelbench" and c.backend == "cpu" and list(c.sources) == [CANDIDATE_FILE]
    assert changed(text, c.rewrite) == (["return torch.diag(self.gain) @ x"], [
        "return self.gain[:, None] * x if x.dim() >= 2 and x.shape[-2] == self.gain.shape[0] and "
        "(x.dtype == self.gain.dtype) else torch.diag(self.gain) @ x"])
    assert c.preconditions and c.preconditions[0].startswith("`x` holds no inf or NaN")
    source = c.sources[CANDIDATE_FILE]
    assert source.startswith(c.rewrite.rstrip("\n")) and source.rstrip().endswith("ModelNew = RowGain")
    mod = types.ModuleType("row_gain_candidate")
    exec(compile(source, CANDIDATE_FILE, "exec"), mod.__dict__)  # noqa: S102 - the proposer's own output
    ref = types.ModuleType("row_gain_reference")
    exec(compile(text, str(ROW_GAIN), "exec"), ref.__dict__)  # noqa: S102
    x = torch.randn(1024, 512)
    torch.manual_seed(3)
    new = mod.ModelNew(*mod.get_init_inputs())
    torch.manual_seed(3)
    old = ref.RowGain(*ref.get_init_inputs())
    assert new.state_dict().keys() == old.state_dict().keys()
    torch.testing.assert_close(new(x), old(x))
    tried = History(attempts=[Attempt(round=1, proposer="rewrite", idea=idea.text, candidate=c)])
    assert prop.ideas(ctx, tried, 8) == []  # not proposed twice
    assert prop.repair(ctx, c, None) is None


def test_nothing_to_rewrite_gives_no_ideas_and_no_noise(caplog):
    prop = RewriteProposer()
    source = module("return torch.relu(x) * self.gain")
    with caplog.at_level(logging.DEBUG, logger="runner.proposers"):
        assert prop.ideas(context(source), History(), 8) == []
        assert prop.implement(context(source), Idea(text="anything"), History(), 2) == []
    assert caplog.records == []


def test_a_search_with_nothing_to_rewrite_does_not_name_the_rewrites(tmp_path):
    res = search(context("# FAKE: ms=0.5\n" + module("return torch.relu(x)")), TableEvaluator(),
                 [(RewriteProposer(), 0.0)], SearchBudget(rounds=1, ideas_per_round=2), tmp_path / "t.jsonl")
    assert res.credit == [] and res.candidates == 0


def test_the_search_asks_the_rewrites_in_the_first_round_only_beside_the_catalogs_share(tmp_path):
    class Builtin:
        name = "catalog"

        def bind(self, session):
            pass

        def ideas(self, ctx, history, n):
            self.asked = getattr(self, "asked", []) + [n]
            return [Idea(text=f"kernel {len(self.asked)}")]

        def implement(self, ctx, idea, history, n):
            return []

        def repair(self, ctx, candidate, verdict):
            return None

    source = "# FAKE: ms=0.5\n" + module("# x: [N, M]\nreturn x * torch.sigmoid(x) + torch.diag(self.gain) @ x + "
                                         "x.float().float()")
    catalog, rewrite = Builtin(), RewriteProposer()
    ev = TableEvaluator()
    res = search(context(source), ev, [(catalog, 1.0), (rewrite, 0.0)],
                 SearchBudget(rounds=2, ideas_per_round=2, implementations_per_idea=2), tmp_path / "t.jsonl")
    assert catalog.asked == [2, 2]  # the catalog keeps its whole share
    rewrites = [c for c in ev.evaluated if c.rewrite]
    assert len(rewrites) == 4 and all(c.id.startswith("r1-rewrite-") for c in rewrites)  # all together, each alone
    assert rewrites[0].idea.count("line 22: `") == 3 and res.best.candidate.rewrite  # the three sites together
    assert [(c.name, c.share, c.ideas, c.verified) for c in res.credit] == [("catalog", 1.0, 2, 0), ("rewrite", 0.0, 4, 4)]


def test_the_rewrite_of_row_gain_is_verified_by_the_harness_on_the_cpu(harness_cache):
    spec = row_gain_spec()
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=cfg) as ev:
        ctx = context(ev.reference_source() + kernelbench_aliases(spec))
        prop = RewriteProposer()
        (idea,) = prop.ideas(ctx, History(), 4)
        (c,) = prop.implement(ctx, idea, History(), 1)
        v = ev.evaluate(c)
    assert v.accepted, v.reasons
    assert {t.shape_set for t in v.trials} == {0, 1} and all(t.passed for t in v.trials)
    assert v.timing.call == "module" and v.timing.n > 0 and v.speedup_vs_eager is not None
