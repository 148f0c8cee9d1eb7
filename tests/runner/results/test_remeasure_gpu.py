"""A PR's figure and its `/fusebot benchmark` re-run agree on the GPU (skipped without one): the harness confirms a
kernel in alternating rounds, fusebot writes the PR's files and states the figures of the PR's own bench script run on
the runner (runner/results/figures.py), and the benchmark job runs that script again on the same host. The re-run's
per-round speedups over the faster baseline (the highest and lowest round left out, runner.harness.confirm.agreeing)
must meet the PR's range widened by the margin the PR states with it (runner.harness.confirm.margin: the larger of the
rounds' spread and the 3% minimum effect, what the same comparison moved by on the H100)."""

from __future__ import annotations

import shutil

import pytest

from runner.contract import Job
from runner.harness.confirm import agreeing, margin
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import run_job
from runner.results.files import Provenance, slug, target_result
from tests.verdicts import EXAMPLE, SPEC, seed_candidate

pytestmark = [pytest.mark.gpu, pytest.mark.timing]  # timed alone: other tests' kernels would share the GPU

KERNELS = "fusebot_kernels"


def test_a_pr_s_figure_and_its_benchmark_rerun_agree_within_their_spreads(tmp_path):
    cand = seed_candidate("cuda")
    with Evaluator(SPEC, backend="cuda", config=HarnessConfig(cache_dir=tmp_path / "cache")) as ev:
        confirmed = ev.confirm(cand, rounds=5)
    assert confirmed.accepted and confirmed.confirmation is not None, confirmed.reasons
    root = tmp_path / "src"
    (root / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, root / "examples" / EXAMPLE.name)
    pr = target_result(SPEC, True, "the search's word", cand, confirmed, Provenance.for_verdict(SPEC.name, confirmed),
                       "", root=root, kernels_dir=KERNELS)
    assert "its bench script, run here" in pr.message, pr.message
    stated = pr.verdict
    assert any("the harness measured" in w and "figures from `python" in w for w in stated.warnings), stated.warnings
    job = Job(id="b1", repo="o/r", sha="1" * 40, kind="benchmark", trigger="comment", targets=[],
              kernels=[slug(SPEC.name)])
    branch = tmp_path / "branch"  # the PR's branch as the benchmark job checks it out: the module and the PR's files
    shutil.copytree(root / "examples", branch / "examples")
    shutil.copytree(root / KERNELS, branch / KERNELS)
    [rerun] = run_job(job, branch, lambda p: None, backend="cuda").targets
    assert rerun.verdict is not None and rerun.verdict.confirmation is not None, \
        (rerun.message, rerun.verdict and rerun.verdict.warnings, rerun.dropin_check)
    said, again = agreeing(stated.confirmation), agreeing(rerun.verdict.confirmation)
    harness = agreeing(confirmed.confirmation)
    rounds = "\n".join(f"{name}: {c.model_dump(include={'candidate_ms', 'eager_ms', 'compile_ms'})}"
                       for name, c in (("harness", confirmed.confirmation), ("PR", stated.confirmation),
                                       ("re-run", rerun.verdict.confirmation)))
    print(f"harness {min(harness):.3f}-{max(harness):.3f}x, PR {min(said):.3f}-{max(said):.3f}x, re-run "
          f"{min(again):.3f}-{max(again):.3f}x over the faster baseline\n{rounds}")
    m = margin(stated.confirmation)
    low, high = min(said) * (1 - m), max(said) * (1 + m)
    assert low <= max(again) and min(again) <= high, f"{said} (margin {m:.3f}) against {again}\n{rounds}"
