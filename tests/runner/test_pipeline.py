"""runner.pipeline.run_job: a bot's Job over a checked-out source tree becomes a JobResult with each target's files."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from runner.contract import Candidate, Job, ProblemSpec, Progress, SearchBudget, TargetSpec
from runner.errors import ProblemError
from runner.harness.evaluator import HarnessConfig
from runner.harness.gpus import device_evaluators
from runner.pipeline import optimize_problem, problem_spec, run_job
from runner.search.types import Idea
from tests.runner.conftest import FAST_TIMER
from tests.runner.cpu_kernels import GOOD, PROBLEM


class OneKernel:
    """A real Proposer: one idea, implemented by one known-good fused C++ kernel."""

    name = "one-kernel"

    def bind(self, session) -> None:
        self.session = session

    def ideas(self, ctx, history, n):
        return [Idea(text="one pass over x", proposer=self.name, round=0, index=0)][:n] if not history.ideas else []

    def implement(self, ctx, idea, history, n):
        return [Candidate(id=f"{idea.id}-c0", format="fast", backend="cpu", sources={"kernel.cpp": GOOD % "job"},
                          idea=idea.text)]

    def repair(self, ctx, candidate, verdict):
        return None


def _repo(tmp_path: Path) -> Path:
    src = tmp_path / "src"
    (src / "models").mkdir(parents=True)
    shutil.copy(PROBLEM, src / "models" / "chain.py")
    (src / "models" / "broken.py").write_text("import torch\nraise RuntimeError('no import for you')\n")
    return src


def test_problem_spec_points_into_the_source_tree(tmp_path):
    src = _repo(tmp_path)
    spec = problem_spec(TargetSpec(name="chain", file="models/chain.py", class_name="Model"), src)
    assert spec.path == str((src / "models/chain.py").resolve()) and spec.root == str(src.resolve())


def test_run_job_searches_every_target_and_reports_broken_ones(tmp_path, monkeypatch, harness_cache):
    """The real harness under run_job, with the test suite's short timer, a 100 ms timer cross-check (its escapes are
    10x; tests/runner/harness has its own tests) and no torch.compile baseline (a cold compile took 14 s on the
    2-core CI machine): the job's flow is the same with one baseline or two."""
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache, cpu_check_ms=100)
    monkeypatch.setattr("runner.pipeline.device_evaluators",
                        lambda spec, backend, devices, config=None, **kw: device_evaluators(spec, backend, devices,
                                                                                             cfg, **kw))
    src = _repo(tmp_path)
    job = Job(id="j1", repo="o/r", sha="0" * 40, targets=[
        TargetSpec(name="chain", file="models/chain.py", class_name="Model"),
        TargetSpec(name="broken", file="models/broken.py", class_name="Model"),
    ], budget=SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1, wall_seconds=3600))
    seen = []
    result = run_job(job, src, seen.append, proposers=[(OneKernel(), 1.0)], backend="cpu")
    assert result.ok and result.job_id == "j1"
    chain, broken = result.targets
    assert chain.verdict is not None, chain.message
    if not chain.verdict.accepted:  # refused by a measurement alone on a loaded CPU (the parent's clock): said, not shipped
        assert "timer-escape" in chain.message or "unstable-measurement" in chain.message, chain.message
        assert not chain.improved and not chain.files
    else:
        assert chain.verdict.timing.median_ms > 0 and chain.verdict.baselines.eager.median_ms > 0
    assert "### Round 1" in chain.trace_markdown
    if chain.improved:  # a kernel is written only when it beat the faster baseline and its drop-in passed its test
        assert "chain/kernel.cpp" in chain.files and "chain/dropin.py" in chain.files
        assert "chain/BENCHMARK.md" in chain.files and chain.dropin_check.passed
        assert "_ref = importlib.import_module('models.chain')" in chain.files["chain/dropin.py"]
    else:
        assert not chain.files
    assert not broken.improved and broken.message.startswith("problem: import") and "no import for you" in broken.message
    assert seen, "progress was reported"
    assert result.environment is not None and result.environment.torch


class FakeKernels:
    """A real Proposer whose kernels the fake devices below read their verdicts from (tests/fakes/evaluators.py):
    verified, and slower than the baselines (no drop-in to check)."""

    name = "fake-kernels"

    def bind(self, session) -> None:
        self.session = session

    def ideas(self, ctx, history, n):
        return [Idea(text="fuse", proposer=self.name, round=0, index=0)][:n] if not history.ideas else []

    def implement(self, ctx, idea, history, n):
        return [Candidate(id=f"c{j}", format="fast", backend="cpu", sources={"kernel.cpp": f"// FAKE: ms=2.{j + 1}\n"})
                for j in range(n)]

    def repair(self, ctx, candidate, verdict):
        return None


def test_targets_are_searched_at_once_one_per_device(tmp_path, monkeypatch):
    """Two fake GPUs, two targets: both searches run at the same time, each on its own device (they wait for each
    other at a barrier), and the results come back in the job's target order."""
    import contextlib
    import threading

    from runner.contract import Baselines, Environment
    from runner.pipeline import device_evaluators as real  # noqa: F401 (what is replaced below)
    from tests.fakes.evaluators import TableEvaluator, timing

    both = threading.Barrier(2, timeout=30)
    opened: list[tuple[str, list[int], int]] = []

    class FakeGpu(TableEvaluator):
        def reference_source(self):
            return "class Model: ...\n"

        def roofline(self):
            return None

        def environment(self, confinement=None):
            return Environment(device="cuda:0", gpu="fake", torch="2", python="3", fusebot="0")

        def baselines(self):
            if not getattr(self, "met", False):  # the first time: the other target's search has started too
                both.wait()
                self.met = True
            return Baselines(eager=timing(1.0), compile=timing(0.8))

    @contextlib.contextmanager
    def fake_devices(spec, backend, devices, config=None, *, total=None, visible=None):
        opened.append((spec.name, list(devices), total))
        yield FakeGpu()

    monkeypatch.setattr("runner.pipeline.device_evaluators", fake_devices)
    src = _repo(tmp_path)
    (src / "models" / "chain2.py").write_text((src / "models" / "chain.py").read_text())
    job = Job(id="j2", repo="o/r", sha="0" * 40, targets=[
        TargetSpec(name="chain", file="models/chain.py", class_name="Model"),
        TargetSpec(name="chain2", file="models/chain2.py", class_name="Model"),
    ], budget=SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=2, wall_seconds=3600))
    seen = []
    result = run_job(job, src, seen.append, backend="cpu", gpus=[0, 1],
                     proposer_pools=[[(FakeKernels(), 1.0)], [(FakeKernels(), 1.0)]])
    assert sorted(opened) == [("chain", [0], 2), ("chain2", [1], 2)] or sorted(opened) == [
        ("chain", [1], 2), ("chain2", [0], 2)]
    assert [t.target for t in result.targets] == ["chain", "chain2"]
    assert all(t.verdict is not None and t.verdict.accepted for t in result.targets)
    assert any("targets started" in p.message for p in seen)  # one progress for both searches
    opened.clear()
    one = job.model_copy(update={"targets": job.targets[:1]})
    both = threading.Barrier(1)
    run_job(one, src, seen.append, backend="cpu", gpus=[0, 1], proposers=[(FakeKernels(), 1.0)])
    assert opened == [("chain", [0, 1], 2)]  # one target: one search over both devices


def test_a_pool_of_proposers_for_each_search_at_once(monkeypatch):
    from runner.pipeline import job_devices, proposer_pools

    job = Job(id="j3", repo="o/r", sha="0" * 40, targets=[
        TargetSpec(name=f"t{i}", file=f"m{i}.py", class_name="Model") for i in range(3)])
    pools = proposer_pools(job, "cuda", [0, 1])
    assert len(pools) == 2 and pools[0][0][0] is not pools[1][0][0]  # searches at once share no proposer
    assert len(proposer_pools(job, "cpu")) == 1 and job_devices("cpu") == []
    assert job_devices("cpu", [0, 1]) == [0, 1]  # given CPU devices: each a slice of the cores
    monkeypatch.setenv("FUSEBOT_GPUS", "1")
    monkeypatch.setattr("runner.pipeline.visible_gpus", lambda: 2)
    assert job_devices("cuda") == [1] and job_devices("cuda", [0]) == [0]


class NoReference:
    """An evaluator whose module fails as it starts: what progress said before is all there is."""

    def reference_source(self) -> str:
        raise ProblemError("import", "models/x.py:1", "ModuleNotFoundError: No module named 'dataset'")


@pytest.mark.parametrize(("compile_baseline", "timed"), [(True, "timing eager and torch.compile ("),
                                                         (False, "timing eager (")])
def test_optimize_says_it_times_the_baselines_before_the_module_starts(tmp_path, compile_baseline, timed):
    seen: list[Progress] = []
    budget = SearchBudget(rounds=1, ideas_per_round=1, implementations_per_idea=1, wall_seconds=60)
    with pytest.raises(ProblemError):
        optimize_problem(ProblemSpec(name="x", module="m"), tmp_path, budget, [], NoReference(), "cpu",
                         progress=seen.append, compile_baseline=compile_baseline)
    assert [p.message.startswith(timed) for p in seen] == [False, True]  # after the budget's split
