"""Nightly hygiene: merged fusebot kernels re-verified by the real harness (CPU) against the module as it is now; one
that is no longer correct is removed by a PR that shows the numbers and leaves a shim so imports keep working; kernels
that still hold open nothing; a re-run updates the same PR."""

from __future__ import annotations

import shutil
import subprocess
import sys

import git

from bot.github.local_platform import LocalPlatform
from bot.github.platform import find_marker
from bot.publish.hygiene import publish_hygiene
from runner.results.files import Provenance, slug, target_files, write_files
from runner.results.remeasure import reverify, stale_reason
from tests.bot.results import improved_result
from tests.verdicts import EXAMPLE, SPEC, real_verdicts, seed_candidate

KERNELS = "fusebot_kernels"


def test_stale_reason_from_real_verdicts():
    fused = real_verdicts()["fused"]  # measured on a CPU that may be loaded: follow its own numbers
    base = min(t.median_ms for t in (fused.baselines.eager, fused.baselines.compile) if t)
    assert (stale_reason(fused) is None) == (fused.timing.median_ms < base)
    slow = real_verdicts()["slow"]
    reason = stale_reason(slow)
    assert reason.startswith("no longer faster") and f"{slow.timing.median_ms:.4g} ms" in reason
    rejected = slow.model_copy(update={"accepted": False, "reasons": ["mismatch: 12 of 64 elements"], "stage": "verify"})
    assert stale_reason(rejected) == "no longer correct: mismatch: 12 of 64 elements"


def test_nothing_stale_opens_nothing(tmp_path):
    repo = git.Repo.init(tmp_path / "r", initial_branch="main")
    (tmp_path / "r" / "a.txt").write_text("a\n")
    repo.index.add(["a.txt"])
    repo.index.commit("initial")
    platform = LocalPlatform(tmp_path / "r")
    assert publish_hygiene(platform, [improved_result()], base="main", base_sha=platform.head_sha("main")) is None
    assert platform.pulls() == [] and [b.name for b in repo.branches] == ["main"]


def test_a_kernel_the_module_changed_under_is_removed_by_a_pr(tmp_path):
    root = tmp_path / "repo"
    (root / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, root / "examples" / EXAMPLE.name)
    v = real_verdicts()["fused"]
    write_files(root / KERNELS, target_files(SPEC, seed_candidate(), v, Provenance.for_verdict(SPEC.name, v)))
    repo = git.Repo.init(root, initial_branch="main")
    repo.git.add("--all")
    repo.index.commit("a fusebot PR, merged")
    module = root / "examples" / EXAMPLE.name  # then someone changes the module: the kernel computes the old one
    module.write_text(module.read_text().replace("torch.relu(", "torch.nn.functional.gelu("))
    repo.git.commit("-am", "gelu instead of relu")

    [result] = reverify(root, KERNELS, backend="cpu")
    assert not result.improved and result.message.startswith("no longer correct")
    assert not result.verdict.accepted and any(not t.passed for t in result.verdict.trials)

    platform = LocalPlatform(root)
    base = platform.head_sha("main")
    first = publish_hygiene(platform, [result], base="main", base_sha=base, environment=result.verdict.environment)
    again = publish_hygiene(platform, [result], base="main", base_sha=base, environment=result.verdict.environment)
    assert first.pull_request.created and not again.pull_request.created and not again.branch.changed
    assert len(platform.pulls()) == 1 and first.branch.branch == "fusebot/main/hygiene"
    body = platform.pull_body(first.pull_request.number)
    assert find_marker(body, "pr") == "main/hygiene" and "no longer correct" in body
    passed = sum(t.passed for t in result.verdict.trials)
    assert passed < len(result.verdict.trials) and f"{passed}/{len(result.verdict.trials)} trials passed" in body
    folder = f"{KERNELS}/{slug(SPEC.name)}"
    names = [b.path for b in repo.commit(first.branch.branch).tree.traverse() if b.type == "blob"]
    assert f"{folder}/kernel.cpp" not in names and f"{folder}/BENCHMARK.md" not in names
    assert f"{folder}/dropin.py" in names and f"{folder}/__init__.py" in names
    checkout = tmp_path / "checkout"
    repo.git.worktree("add", str(checkout), first.branch.branch)
    probe = ("from fusebot_kernels.scaledbiasrelu.dropin import ScaledBiasReLU as A\n"
             "from examples.mlp_epilogue import ScaledBiasReLU as B\nassert A is B\n")
    subprocess.run([sys.executable, "-c", probe], cwd=checkout, check=True)  # imports of the drop-in keep working
