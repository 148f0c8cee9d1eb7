"""Source rewrites on CUDA (run on the H100; skipped without a GPU): examples/row_gain.py's rewrite and a timm-style
attention block's F.scaled_dot_product_attention are verified by the harness, every kernel check included, and
timed against eager."""

from __future__ import annotations

import logging

import pytest

from runner.contract import ProblemSpec
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import kernelbench_aliases
from runner.proposers.rewrite.proposer import RewriteProposer
from runner.search.types import History

from ...conftest import FAST_TIMER
from .test_attention import TIMM
from .test_proposer import context, row_gain_spec

pytestmark = pytest.mark.gpu
log = logging.getLogger(__name__)

ATTENTION_PROBLEM = TIMM.replace("dim=32, num_heads=4", "dim=768, num_heads=12") + '''

def get_inputs():
    return [torch.randn(8, 1024, 768)]


def get_init_inputs():
    return []
'''


def verdict(spec: ProblemSpec, tmp_path):
    cfg = HarnessConfig(compile_baseline=True, timer=FAST_TIMER, cache_dir=tmp_path / "cache")
    with Evaluator(spec, backend="cuda", config=cfg) as ev:
        ctx = context(ev.reference_source() + kernelbench_aliases(spec), backend="cuda")
        prop = RewriteProposer()
        (idea,) = prop.ideas(ctx, History(), 4)
        (c,) = prop.implement(ctx, idea, History(), 1)
        v = ev.evaluate(c)
    log.info("%s: rewrite %.4g ms, eager %.4g ms, torch.compile %s ms", spec.name, v.timing.median_ms if v.timing
             else float("nan"), v.baselines.eager.median_ms, v.baselines.compile.median_ms
             if v.baselines.compile else None)
    return v


def test_row_gains_rewrite_is_verified_and_faster_than_eager_on_cuda(tmp_path):
    v = verdict(row_gain_spec(), tmp_path)
    assert v.accepted, v.reasons
    assert v.speedup_vs_eager > 1.0  # a broadcast multiply, not a [1024, 1024] @ [1024, 512] GEMM


def test_attention_rewritten_to_sdpa_is_verified_on_cuda(tmp_path):
    path = tmp_path / "attention.py"
    path.write_text(ATTENTION_PROBLEM)
    v = verdict(ProblemSpec(name="attention", path=str(path), class_name="Attention"), tmp_path)
    assert v.accepted, v.reasons
    assert v.speedup_vs_eager > 1.0  # no [8, 12, 1024, 1024] score matrix written and read back
