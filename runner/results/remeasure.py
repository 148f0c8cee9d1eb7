"""Benchmark and hygiene jobs: no search; the kernels in the job's commit re-verified and re-timed.

    result = run_kernel_job(job, source_dir, progress, backend="cuda")

`benchmark` (`/fusebot benchmark` on a fusebot PR): each kernel folder as it is on the PR's branch, a maintainer's
edits to the kernel included, goes through the harness again (every trial, timing against eager and torch.compile,
then alternating confirmation rounds as a search's winner), and its drop-in's own test runs on a scratch copy of the
branch. `improved` then means "verified and faster than the faster baseline", and `message` says why not.
`hygiene` (nightly, on the default branch): runner/results/reverify.py's verdict on each merged kernel; a stale one comes back
with the files that remove it.

A bad kernel is a result with reasons; a broken machine raises (runner/errors.py), and the worker fails the job.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from runner.contract import DropinCheck, Job, JobResult, Progress, TargetResult, Verdict
from runner.errors import ProblemError
from runner.results.reverify import manifest_spec, merged_kernels, remeasure, reverify, unmeasured

log = logging.getLogger(__name__)

CONFIRM_ROUNDS = 3  # alternating rounds (kernel, eager, torch.compile) after the full verification


def assessment(v: Verdict, check: DropinCheck | None = None) -> tuple[bool, str]:
    """(holds, why) for a re-measured kernel: verified by the harness and by its drop-in's test, and faster than the
    faster of eager and torch.compile (in every alternating round, when it was timed in rounds). Pure."""
    if not v.accepted:
        return False, "not verified: " + "; ".join(v.reasons[:3] or [f"rejected at {v.stage}"])
    if check is not None and not check.passed:
        return False, "not verified: its drop-in failed its own test (" + "; ".join(check.reasons) + ")"
    if v.degenerate:
        return False, "verified, but the problem is degenerate (its output does not depend on its input): no speedup"
    base = [(n, t) for n, t in (("eager", v.baselines.eager), ("torch.compile", v.baselines.compile)) if t] \
        if v.baselines else []
    if v.timing is None or not base:
        return True, f"verified; {'no baseline was measured' if v.timing else 'not timed'}"
    faster, base_t = min(base, key=lambda nt: nt[1].median_ms)
    ms, base_ms = v.timing.median_ms, base_t.median_ms
    spread = ""
    if v.confirmation is not None and v.confirmation.rounds:
        per_round = v.confirmation.speedup_vs_faster()
        spread = f"; {min(per_round):.2f}-{max(per_round):.2f}x over {v.confirmation.rounds} alternating rounds"
        if min(per_round) <= 1.0:
            return False, (f"verified, but not faster than {faster} in every round: {ms:.4g} ms against "
                           f"{base_ms:.4g} ms{spread}")
    elif ms >= base_ms:
        return False, f"verified, but not faster: {ms:.4g} ms against {base_ms:.4g} ms for {faster}"
    return True, f"verified; {ms:.4g} ms, {base_ms / ms:.2f}x faster than {faster} ({base_ms:.4g} ms{spread})"


def benchmark_kernels(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, backend: str | None = None,
                      workdir: Path | None = None, confirm_rounds: int = CONFIRM_ROUNDS) -> list[TargetResult]:
    from runner.results.files import check_dropin

    root, kd = Path(source_dir), job.kernels_dir
    found = merged_kernels(root, kd, job.kernels or None)
    missing = sorted(set(job.kernels) - {folder for folder, _ in found})
    results = [unmeasured(folder, None, kd, f"no readable kernel manifest in {kd}/{folder}: nothing to measure",
                          holds=False) for folder in missing]
    for i, (folder, m) in enumerate(found):
        progress(Progress(verified=i, message=f"re-measuring {kd}/{folder} ({i + 1} of {len(found)})"))
        try:
            verdict = remeasure(root, kd, folder, m, backend=backend, confirm_rounds=confirm_rounds)
            spec = manifest_spec(root, m)
        except (ProblemError, OSError, KeyError, ValueError) as e:
            log.warning("%s/%s: not measured: %s", kd, folder, e)
            results.append(unmeasured(folder, m, kd, f"not measured: {e}", holds=False))
            continue
        check = None
        if verdict.accepted:  # the drop-in as it is on the branch, on a scratch copy (its test writes a build cache)
            with tempfile.TemporaryDirectory(prefix="fusebot-check-", dir=workdir) as scratch:
                shutil.copytree(root, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
                check = check_dropin(Path(scratch), kd, spec.name)
        holds, why = assessment(verdict, check)
        results.append(TargetResult(target=spec.name, improved=holds, verdict=verdict, message=why,
                                    dropin_check=check, class_name=spec.class_name,
                                    kernel=f"{kd}/{folder}/{m['kernel']}"))
        log.info("%s/%s: %s", kd, folder, why)
    return results


def run_kernel_job(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, backend: str | None = None,
                   workdir: Path | None = None) -> JobResult:
    """A benchmark or hygiene job over the job's checked-out source tree."""
    if job.kind == "benchmark":
        results = benchmark_kernels(job, source_dir, progress, backend=backend, workdir=workdir)
    elif job.kind == "hygiene":
        results = reverify(Path(source_dir), job.kernels_dir, backend, folders=job.kernels or None, progress=progress)
    else:
        raise ValueError(f"job {job.id} is a {job.kind} job, not a benchmark or hygiene job")
    environment = next((r.verdict.environment for r in results if r.verdict and r.verdict.environment), None)
    return JobResult(job_id=job.id, ok=True, targets=results, environment=environment)
