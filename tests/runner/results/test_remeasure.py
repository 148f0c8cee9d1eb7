"""Benchmark and hygiene jobs on the runner: no search; the kernel folders in the job's source tree go through the real
harness (CPU backend) as they are, a maintainer's edit included, and come back as verdicts with reasons."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path
from typing import get_args

import pytest

from runner.contract import Job, JobKind, JobResult, Verdict
from runner.harness.config import HarnessConfig, confirm_rounds_setting, timing_cores
from runner.pipeline import run_job
from runner.results.figures import assessment
from runner.results.files import Provenance, slug, target_files, write_files
from runner.results.remeasure import KERNEL_JOBS, merged_kernels
from tests.verdicts import EXAMPLE, SPEC, seed_candidate

KERNELS = "fusebot_kernels"
FOLDER = slug(SPEC.name)


def test_hygiene_leaves_a_merged_rewrite_alone(tmp_path):
    folder = tmp_path / KERNELS / "w"
    folder.mkdir(parents=True)
    (folder / "fusebot.json").write_text(json.dumps({"kind": "rewrite", "problem": {"name": "w"}}))
    assert merged_kernels(tmp_path, KERNELS) == []
    assert [f for f, _ in merged_kernels(tmp_path, KERNELS, rewrites=True)] == ["w"]


def _source_tree(tmp_path: Path) -> Path:
    """A repository as a fusebot PR's branch holds it: the module, and the kernel folder fusebot wrote for it."""
    root = tmp_path / "src"
    (root / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, root / "examples" / EXAMPLE.name)
    v = Verdict(candidate_id="fused", problem=SPEC.name, accepted=True)  # the numbers in BENCHMARK.md do not matter
    write_files(root / KERNELS, target_files(SPEC, seed_candidate(), v, Provenance.for_verdict(SPEC.name, v)))
    return root


@pytest.fixture
def cpu_env(monkeypatch):
    monkeypatch.setenv("OMP_NUM_THREADS", "1")


def _bench(root: Path, kernels: list[str]) -> JobResult:
    job = Job(id="b1", repo="o/r", sha="1" * 40, kind="benchmark", trigger="comment", targets=[], kernels=kernels)
    seen = []
    result = run_job(job, root, seen.append, backend="cpu")
    assert seen and all("re-measuring fusebot_kernels/" in p.message for p in seen)
    return result


@pytest.mark.slow
@pytest.mark.timeout(1500)  # the harness, the drop-in's test and the bench script's rounds, on a 2-core host
def test_benchmark_job_remeasures_the_kernel_on_the_branch(tmp_path, cpu_env):
    root = _source_tree(tmp_path)
    result = _bench(root, [FOLDER, "gone"])
    assert result.ok and result.job_id == "b1"
    gone, [r] = [t for t in result.targets if t.verdict is None], [t for t in result.targets if t.verdict]
    assert [g.message for g in gone] == ["no readable kernel manifest in fusebot_kernels/gone: nothing to measure"]
    v = r.verdict
    assert v.accepted and r.kernel == f"{KERNELS}/{FOLDER}/kernel.cpp" and r.class_name == "ScaledBiasReLU"
    assert v.timing.median_ms > 0 and v.baselines.eager.median_ms > 0 and v.baselines.compile.median_ms > 0
    # the figures are the bench script's, run as the PR says to run it: its rounds and every raw sample
    rounds = confirm_rounds_setting(os.environ)  # a search's confirmation's (the suite's: tests/conftest.py)
    assert v.confirmation is not None and v.confirmation.rounds == rounds and v.timing.n >= 10 * rounds
    # on the threads the harness's CPU timing gives each contestant, whatever OMP_NUM_THREADS says (1 here): a PR's
    # figure and this re-measure compare the same eager and torch.compile
    threads = len(timing_cores(HarnessConfig()))
    assert any(w.startswith(f"figures from `python {FOLDER}/bench_{FOLDER}.py` (") and
               f", {threads} CPU thread(s), {rounds} rounds;" in w for w in v.warnings), v.warnings
    assert len({t.shape_set for t in v.trials}) == 2 and all(t.passed for t in v.trials)
    assert r.dropin_check is not None and r.dropin_check.passed and r.dropin_check.passed_tests > 0
    assert (r.improved, r.message) == assessment(v, r.dropin_check)  # faster or not, as this machine measured it
    assert result.environment == v.environment and result.environment.device == "cpu"


def test_benchmark_job_reports_an_edited_kernel_that_is_wrong(tmp_path, cpu_env):
    root = _source_tree(tmp_path)
    kernel = root / KERNELS / FOLDER / "kernel.cpp"
    kernel.write_text(kernel.read_text().replace("v < 0.0f ? 0.0f : v", "v > 0.25f ? v : 0.0f"))  # the edit
    [r] = _bench(root, [FOLDER]).targets
    assert not r.improved and not r.verdict.accepted and r.dropin_check is None
    assert r.message.startswith("not verified: mismatch"), r.message
    assert any(not t.passed for t in r.verdict.trials)


def test_benchmark_job_reports_a_module_that_no_longer_imports(tmp_path, cpu_env):
    root = _source_tree(tmp_path)
    (root / "examples" / EXAMPLE.name).write_text("raise RuntimeError('moved away')\n")
    [r] = _bench(root, []).targets  # no folders named: every kernel under the kernels dir
    assert not r.improved and r.verdict is None and r.target == SPEC.name
    assert r.message.startswith("not measured: ") and "moved away" in r.message


def test_old_job_payloads_still_parse_as_searches():
    old = {"schema_version": 1, "id": "j", "repo": "o/r", "sha": "0" * 40, "targets": []}
    job = Job.model_validate(old)
    assert (job.kind, job.kernels_dir, job.kernels) == ("search", "fusebot_kernels", [])


def test_every_kind_that_searches_nothing_has_a_runner_entry():
    """runner/pipeline.py searches; each other kind runs from KERNEL_JOBS (its publisher: tests/bot/publish/test_kinds.py)."""
    assert set(KERNEL_JOBS) == set(get_args(JobKind)) - {"search"}
