"""What `/fusebot benchmark` and nightly hygiene say, from real Verdicts (the CPU harness, run once per session): each
kernel's table and a verdict line per state (verified and faster, verified but slower, not verified with every reason,
not measured); the check-run conclusion; and the pure helpers behind the jobs (kernel folders, timestamps)."""

from __future__ import annotations

import json

from bot.github.platform import find_marker, marker
from bot.publish.benchmark import benchmark_check, benchmark_comment, beside_line, branch_manifests, conclusion, state
from bot.publish.hygiene import hygiene_check
from bot.publish.propose import same_but_timestamps
from bot.publish.text import BODY_LIMIT
from bot.publish.verdicts import environment_line
from bot.repo.discovery import kernel_folders, touched_kernel_folders
from runner.contract import Baselines, DropinCheck, Job, JobResult, TargetResult, Verdict
from tests.fakes.evaluators import timing
from tests.verdicts import real_verdicts

JOB = Job(id="bench-0123456789abcdef", repo="acme/models", sha="c0ffee" * 6 + "abcd", ref="fusebot/main/epilogue",
          trigger="comment", pr_number=12, targets=[], kind="benchmark", kernels=["epilogue"])
KERNEL = "fusebot_kernels/epilogue/kernel.cpp"


def measured(name: str, improved: bool, message: str, **kw) -> TargetResult:
    return TargetResult(target=name, improved=improved, verdict=kw.pop("verdict", None) or real_verdicts()["fused"],
                        message=message, class_name=name, kernel=KERNEL, **kw)


def test_each_state_gets_its_table_and_its_verdict_line():
    v, slow = real_verdicts()["fused"], real_verdicts()["slow"]
    faster = measured("Fast", True, "verified; 0.1 ms, 2.00x faster than eager (0.2 ms)")
    slower = measured("Slow", False, "verified, but not faster: 9 ms against 0.2 ms for eager", verdict=slow)
    wrong = v.model_copy(update={"accepted": False, "stage": "verify", "timing": None,
                                 "reasons": ["mismatch: 12 of 64 elements differ", "second-shape: wrong shape"]})
    broken = measured("Wrong", False, "not verified: mismatch: 12 of 64 elements differ", verdict=wrong)
    failed_test = measured("Dropin", False, "not verified: its drop-in failed its own test (x)",
                           dropin_check=DropinCheck(passed=False, command="pytest", reasons=["1 failed"]))
    gone = TargetResult(target="Gone", improved=False, message="not measured: import: models/x.py: No module",
                        class_name="Gone")
    results = [faster, slower, broken, failed_test, gone]
    assert [state(r) for r in results] == ["faster", "slower", "unverified", "unverified", "unmeasured"]

    body = benchmark_comment(JOB, JobResult(job_id=JOB.id, ok=True, targets=results, environment=v.environment))
    assert find_marker(body, "benchmark") == JOB.id
    assert "`fusebot/main/epilogue` at `c0ffeec0ffee`" in body
    assert "**1 of 5 kernel(s) verified and faster than the faster of PyTorch eager and torch.compile; 1 verified " \
           "but not faster; 2 not verified; 1 not measured**" in body
    assert f"| **fusebot** | {v.timing.median_ms:.4g} | {v.timing.iqr_ms:.3g} | {v.timing.n} |" in body
    assert f"| **fusebot** | {slow.timing.median_ms:.4g} |" in body
    assert "**Verified and faster**: 0.1 ms, 2.00x faster than eager (0.2 ms)." in body
    assert "**Verified**, but not faster: 9 ms against 0.2 ms for eager." in body
    assert "- mismatch: 12 of 64 elements differ\n- second-shape: wrong shape" in body
    assert "- drop-in test: 1 failed" in body
    assert "**Not measured**: not measured: import: models/x.py: No module" in body
    assert "Not proposed" not in body and f"Kernel measured: `{KERNEL}`" in body
    assert environment_line(v.environment) in body

    assert conclusion([faster]) == "success" and conclusion([faster, slower]) == "neutral"
    assert conclusion(results) == "failure" and conclusion([gone]) == "failure"
    check = benchmark_check(JOB, JobResult(job_id=JOB.id, ok=True, targets=results))
    assert check.conclusion == "failure" and check.title == "Not verified: Wrong, Dropin, Gone"
    assert benchmark_check(JOB, JobResult(job_id=JOB.id, ok=True, targets=[faster])).conclusion == "success"


def test_a_long_benchmark_comment_fits_githubs_limit():
    v = real_verdicts()["fused"]
    many = v.model_copy(update={"accepted": False, "reasons": ["mismatch: " + "x" * 5000] * 50})
    results = [measured(f"T{i}", False, "not verified", verdict=many) for i in range(60)]
    body = benchmark_comment(JOB, JobResult(job_id=JOB.id, ok=True, targets=results))
    assert len(body) <= BODY_LIMIT and body.startswith(marker("benchmark", JOB.id))
    assert "…and 42 more" in body  # eight reasons shown per kernel, each cut short


def test_hygiene_check_run():
    v = real_verdicts()["fused"]
    holds = measured("Fast", True, "still correct and faster")
    stale = measured("Old", False, "no longer correct: mismatch: 3 of 9", verdict=v.model_copy(update={"accepted": False}))
    ok = hygiene_check([holds])
    assert ok.conclusion == "success" and ok.title == "All 1 merged kernel(s) still hold"
    out = hygiene_check([holds, stale], pr_url="https://github.com/acme/models/pull/9")
    assert out.conclusion == "neutral" and out.title == "1 of 2 merged kernel(s) no longer hold"
    assert "https://github.com/acme/models/pull/9" in out.summary and "no longer correct: mismatch" in out.summary


def test_kernel_folders_are_found_by_their_manifests(tmp_path):
    for folder, files in {"a": ["fusebot.json", "kernel.cu"], "b": ["kernel.cu"], "c": ["fusebot.json"]}.items():
        for f in files:
            (tmp_path / "k" / folder).mkdir(parents=True, exist_ok=True)
            (tmp_path / "k" / folder / f).write_text("{}")
    assert kernel_folders(tmp_path, "k") == ["a", "c"] and kernel_folders(tmp_path, "k", ["c", "b"]) == ["c"]
    assert kernel_folders(tmp_path, "missing") == []
    changed = ["k/a/kernel.cu", "k/a/BENCHMARK.md", "k/__init__.py", "models/x.py", "kx/a/y", "k/c/fusebot.json"]
    assert touched_kernel_folders(changed, "k") == ["a", "c"]
    assert touched_kernel_folders(["lib/kernels/a/k.cu"], "lib/kernels/") == ["a"]


def test_same_but_timestamps():
    a = "// date: 2026-01-01T03:00:00+00:00\nat commit abc (2026-01-01T03:00:00+00:00).\n"
    assert same_but_timestamps(a, a.replace("01T03", "02T04"))
    assert not same_but_timestamps(a, a.replace("abc", "abd"))
    assert not same_but_timestamps(a, a + "// tuned\n")


def test_the_prs_figures_stand_beside_the_bench_scripts():
    now = Verdict(candidate_id="k", problem="p", accepted=True, timing=timing(0.6),
                  baselines=Baselines(eager=timing(2.0), compile=timing(1.2)))
    r = measured("Fast", True, "verified", verdict=now)
    claimed = {"timings": {"PyTorch eager": {"median_ms": 2.1}, "torch.compile": {"median_ms": 1.0},
                           "fusebot": {"median_ms": 0.5}}}

    class Branch:  # the PR's branch as the platform reads it
        def read_file(self, sha, path):
            assert sha == JOB.sha
            return json.dumps(claimed) if path == "fusebot_kernels/epilogue/fusebot.json" else None

    manifests = branch_manifests(Branch(), JOB.sha, [r, TargetResult(target="Gone", improved=False)])
    assert manifests == {KERNEL: claimed}
    line = beside_line(r, manifests[KERNEL])
    assert line == ("The PR's figures: PyTorch eager 2.1 ms, torch.compile 1 ms, fusebot 0.5 ms: 2.00x over the "
                    "faster baseline. Now, by its bench script: PyTorch eager 2 ms, torch.compile 1.2 ms, fusebot "
                    "0.6 ms: 2.00x over the faster baseline.")
    body = benchmark_comment(JOB, JobResult(job_id=JOB.id, ok=True, targets=[r]), manifests=manifests)
    assert line in body and "bench script" in body
