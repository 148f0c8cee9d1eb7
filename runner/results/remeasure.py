"""Benchmark and hygiene jobs: no search; the kernels in the job's commit re-verified and re-timed.

    result = run_kernel_job(job, source_dir, progress, backend="cuda")

`benchmark` (`/fusebot benchmark` on a fusebot PR): each kernel folder as it is on the PR's branch, a maintainer's
edits to the kernel included, goes through the harness again (every trial), its drop-in's own test runs on a scratch
copy of the branch, and then its bench script (`bench_<folder>.py`, runner/results/bench_script.py) runs there exactly
as the PR tells a reader to run it: its figures (alternating rounds against eager and torch.compile, every raw
sample) are the ones reported. `improved` then means "verified and faster than the faster baseline by the minimum
effect" (runner.harness.confirm.margin), and `message` says why not.
`hygiene` (nightly, on the default branch): every kernel fusebot added that is now merged is re-verified and re-timed
against the module as it is now, on this machine's torch and device (`reverify`). A kernel is stale when the harness
rejects it (the module changed under it, or a trial now fails) or when it no longer beats the faster of eager and
torch.compile; a stale one comes back with the files that remove it. Each `<kernels_dir>/<target>/fusebot.json`
(written with the kernel, runner/results/files.py) names the problem and how the kernel is built.

A bad kernel is a result with reasons; a broken machine raises (runner/errors.py), and the worker fails the job.
"""

from __future__ import annotations

import json
import logging
import shutil
import tempfile
from collections.abc import Callable, Iterable
from pathlib import Path

from runner.contract import (
    MANIFEST_FILE,
    REMOVED_FILE,
    Candidate,
    Job,
    JobResult,
    ProblemSpec,
    Progress,
    TargetResult,
    Verdict,
)
from runner.errors import ProblemError
from runner.harness.config import HarnessConfig, timing_cores
from runner.harness.evaluator import Evaluator, default_backend
from runner.results.bench_script import bench_filename
from runner.results.figures import assessment, processes_for, run_bench_script, with_figures
from runner.results.files import check_dropin
from runner.results.proposal import REWRITE

log = logging.getLogger(__name__)




def benchmark_kernels(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, backend: str | None = None,
                      workdir: Path | None = None) -> list[TargetResult]:
    """Each kernel folder as it is on the branch: verified by the harness (every trial), its drop-in's test run, then
    its bench script run exactly as a maintainer would (`python <kernels_dir>/<folder>/bench_<folder>.py`): the
    figures reported are the script's. A PyTorch rewrite's folder is timed by its script alone."""
    root, kd = Path(source_dir), job.kernels_dir
    found = merged_kernels(root, kd, job.kernels or None, rewrites=True)
    missing = sorted(set(job.kernels) - {folder for folder, _ in found})
    results = [unmeasured(folder, None, kd, f"no readable kernel manifest in {kd}/{folder}: nothing to measure",
                          holds=False) for folder in missing]
    for i, (folder, m) in enumerate(found):
        progress(Progress(verified=i, message=f"re-measuring {kd}/{folder} ({i + 1} of {len(found)})"))
        rewrite = m.get("kind") == REWRITE
        try:
            spec = manifest_spec(root, m)
            verdict = None if rewrite else remeasure(root, kd, folder, m, backend=backend)
        except (ProblemError, OSError, KeyError, ValueError) as e:
            log.warning("%s/%s: not measured: %s", kd, folder, e)
            results.append(unmeasured(folder, m, kd, f"not measured: {e}", holds=False))
            continue
        check, figures = None, None
        if verdict is None or verdict.accepted:  # on a scratch copy: the test and the script write build caches
            with tempfile.TemporaryDirectory(prefix="fusebot-check-", dir=workdir) as scratch:
                shutil.copytree(root, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
                check = None if rewrite else check_dropin(Path(scratch), kd, spec.name)
                if check is None or check.passed:
                    on = backend or m.get("backend") or default_backend()
                    figures = run_bench_script(Path(scratch), kd, folder, processes=processes_for(on),
                                               threads=len(timing_cores(HarnessConfig())) if on == "cpu" else None)
        if verdict is None and not isinstance(figures, dict):
            results.append(unmeasured(folder, m, kd, f"not measured: {figures}", holds=False))
            continue
        verdict = with_figures(verdict, figures, spec.name, folder)
        holds, why = assessment(verdict, check)
        results.append(TargetResult(target=spec.name, improved=holds, verdict=verdict, message=why,
                                    dropin_check=check, class_name=spec.class_name,
                                    kernel=f"{kd}/{folder}/{m.get('kernel') or bench_filename(folder)}"))
        log.info("%s/%s: %s", kd, folder, why)
    return results


# ---- hygiene: re-verify merged kernels ---------------------------------------------------------------------


def stale_reason(v: Verdict) -> str | None:
    """Why a merged kernel should go, or None when it still earns its place. Pure."""
    if not v.accepted:
        return "no longer correct: " + "; ".join(v.reasons[:3] or [f"rejected at {v.stage}"])
    times = [t.median_ms for t in (v.baselines.eager, v.baselines.compile) if t] if v.baselines else []
    if v.timing is None or not times:
        return None
    base = min(times)
    if v.timing.median_ms >= base:
        return (f"no longer faster: {v.timing.median_ms:.4g} ms against {base:.4g} ms for the faster of eager and "
                "torch.compile")
    return None


def merged_kernels(root: Path, kernels_dir: str, folders: Iterable[str] | None = None, *,
                   rewrites: bool = False) -> list[tuple[str, dict]]:
    """(folder, manifest) of every fusebot kernel under root/kernels_dir (only `folders`, when given); with
    `rewrites`, PyTorch rewrites' folders too (hygiene leaves them alone: the module is the rewrite now)."""
    wanted = set(folders) if folders is not None else None
    out = []
    for f in sorted((root / kernels_dir).glob(f"*/{MANIFEST_FILE}")):
        if wanted is not None and f.parent.name not in wanted:
            continue
        try:
            m = json.loads(f.read_text())
        except (OSError, ValueError) as e:
            log.warning("%s: unreadable manifest (%s); skipped", f, e)
            continue
        if rewrites or m.get("kind") != REWRITE:
            out.append((f.parent.name, m))
    return out


def manifest_spec(root: Path, m: dict) -> ProblemSpec:
    return ProblemSpec(**m["problem"], root=str(root))


def remeasure(root: Path, kernels_dir: str, folder: str, m: dict, *, backend: str | None = None,
              confirm_rounds: int = 0) -> Verdict:
    """One kernel folder through the harness again, as its files are now: every trial, then timing against eager and
    torch.compile. With `confirm_rounds`, an accepted kernel is then timed in alternating rounds as a search's winner
    is (Evaluator.confirm): the verdict keeps every trial and the rounds. A bad kernel is a verdict; a broken problem
    raises ProblemError; a missing kernel file raises OSError; a broken machine raises MachineError."""
    kernel = (root / kernels_dir / folder / m["kernel"]).read_text()
    cand = Candidate(id=f"merged-{folder}", format="fast", backend=m["backend"], sources={m["kernel"]: kernel},
                     extra_cflags=m.get("extra_cflags", []))
    with Evaluator(manifest_spec(root, m), backend=backend or m["backend"] or default_backend()) as ev:
        verdict = ev.evaluate(cand)
        if confirm_rounds and verdict.accepted:
            confirmed = ev.confirm(cand, rounds=confirm_rounds)
            verdict = confirmed.model_copy(update={"trials": [*verdict.trials, *confirmed.trials]})
    return verdict


def unmeasured(folder: str, m: dict | None, kernels_dir: str, why: str, *, holds: bool) -> TargetResult:
    """A kernel the harness could not take (its module fails to import, its source is gone): no verdict, the reason."""
    problem = (m or {}).get("problem") or {}
    kernel = f"{kernels_dir}/{folder}/{m['kernel']}" if m and m.get("kernel") else None
    return TargetResult(target=problem.get("name") or folder, improved=holds, message=why,
                        class_name=problem.get("class_name"), kernel=kernel)


def shim_source(spec: ProblemSpec) -> str:
    """What replaces a removed drop-in: the original class under the drop-in's name, so imports keep working, and
    `adopt` answering the original class, so a module that adopted the drop-in (runner/results/adoption.py) keeps its
    own; `adopt` comes first, as in the drop-in: that module may be the one importing this."""
    return (f'"""{spec.class_name} ({spec.name}): the fusebot kernel was removed (see the PR that removed it); this is the '
            'original module again."""\n\n\n'
            "def adopt(original):\n"
            '    """The class a module that adopted the removed drop-in keeps: its own."""\n'
            "    return original\n\n\n"
            f"from {spec.module} import {spec.class_name}  # noqa: E402, F401\n")


def removal(root: Path, kernels_dir: str, folder: str, spec: ProblemSpec) -> dict[str, str]:
    """Every file of the folder removed, except the drop-in (replaced by a shim) and the package markers."""
    out = {}
    for p in sorted((root / kernels_dir / folder).rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(root / kernels_dir).as_posix()
        if p.name == "dropin.py" and spec.module:
            out[rel] = shim_source(spec)
        elif p.name != "__init__.py":
            out[rel] = REMOVED_FILE
    return out


def reverify(root: Path, kernels_dir: str, backend: str | None = None, *, folders: Iterable[str] | None = None,
             progress: Callable[[Progress], None] | None = None) -> list[TargetResult]:
    """One TargetResult per merged kernel: `improved` true when it still holds, else the reason in `message`; the
    fresh verdict either way. `files` lists the folder's paths (relative to the kernels dir) for a removal.

    A kernel that cannot be re-verified at all (its module no longer imports, its source is gone) is kept, with the
    reason: hygiene removes only what the harness has shown to be wrong or slower, never what it could not run."""
    kernels = merged_kernels(root, kernels_dir, folders)
    results = []
    for i, (folder, m) in enumerate(kernels):
        if progress is not None:
            progress(Progress(verified=i, message=f"re-verifying {kernels_dir}/{folder} ({i + 1} of {len(kernels)})"))
        try:
            verdict = remeasure(root, kernels_dir, folder, m, backend=backend)
        except (ProblemError, OSError, KeyError, ValueError) as e:
            log.warning("%s/%s: could not be re-verified: %s", kernels_dir, folder, e)
            results.append(unmeasured(folder, m, kernels_dir, f"could not be re-verified ({e}); kept", holds=True))
            continue
        spec = manifest_spec(root, m)
        reason = stale_reason(verdict)
        files = removal(root, kernels_dir, folder, spec) if reason else {}
        results.append(TargetResult(target=spec.name, improved=reason is None, verdict=verdict,
                                    message=reason or "still correct and faster", class_name=spec.class_name,
                                    files=files, kernel=f"{kernels_dir}/{folder}/{m['kernel']}"))
    return results


def _hygiene(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, backend: str | None = None,
             workdir: Path | None = None) -> list[TargetResult]:
    """Every merged kernel (or the job's `kernels`) re-verified and re-timed (`reverify`)."""
    return reverify(Path(source_dir), job.kernels_dir, backend, folders=job.kernels or None, progress=progress)


# ---- the job kinds that search nothing ---------------------------------------------------------------------
# The runner's entry for each job kind (runner.contract.JobKind) but a search (runner/pipeline.py): the job's results
# from its checked-out source. A new kind is one line here, and its publisher in bot/publish/kinds.py.
KERNEL_JOBS: dict[str, Callable[..., list[TargetResult]]] = {"benchmark": benchmark_kernels, "hygiene": _hygiene}


def run_kernel_job(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, backend: str | None = None,
                   workdir: Path | None = None) -> JobResult:
    """A job of a kind in KERNEL_JOBS over the job's checked-out source tree."""
    run = KERNEL_JOBS.get(job.kind)
    if run is None:
        raise ValueError(f"job {job.id} is a {job.kind} job, not one of {', '.join(KERNEL_JOBS)}")
    results = run(job, source_dir, progress, backend=backend, workdir=workdir)
    environment = next((r.verdict.environment for r in results if r.verdict and r.verdict.environment), None)
    return JobResult(job_id=job.id, ok=True, targets=results, environment=environment)
