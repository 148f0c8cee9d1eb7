"""A job from the bot, run on this host: every target searched, its result folder read back into the JobResult.

`fusebot worker` calls `run_job` for each job it leases (runner/worker.py). A broken target (its module fails to
import, its reference fails) is reported on that target and the others still run; a broken machine raises.
Benchmark and hygiene jobs search nothing: runner/remeasure.py re-verifies and re-times the kernels in the commit.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from runner.contract import Job, JobResult, ProblemSpec, Progress, TargetResult, TargetSpec
from runner.errors import ProblemError
from runner.results import DEFAULT_KERNELS_DIR, Provenance, target_result

log = logging.getLogger(__name__)


def problem_spec(target: TargetSpec, source_dir: Path) -> ProblemSpec:
    """The harness's view of a marked module: its file under the job's source tree, imported with the tree on
    sys.path so that the module's own imports resolve."""
    return ProblemSpec(
        name=target.name,
        path=str((source_dir / target.file).resolve()),
        root=str(source_dir.resolve()),
        class_name=target.class_name,
        inputs=target.inputs,
        init_inputs=target.init_inputs,
        init_args=target.init_args,
        init_kwargs=target.init_kwargs,
        second_inputs=target.second_inputs,
        input_shapes=target.input_shapes,
        dtype=target.dtype,
        atol=target.atol,
        rtol=target.rtol,
    )


def dropin_spec(spec: ProblemSpec) -> ProblemSpec:
    """The same problem named as a module of the repository, so the drop-in subclasses the user's own class."""
    if not (spec.path and spec.root) or not Path(spec.path).is_relative_to(spec.root):
        return spec
    module = Path(spec.path).relative_to(spec.root).with_suffix("").as_posix().replace("/", ".")
    return spec.model_copy(update={"path": None, "module": module})


def accepted_result(job: Job, target: TargetSpec, spec: ProblemSpec, outcome, source_dir: Path,
                    workdir: Path | None, kernels_dir: str = DEFAULT_KERNELS_DIR) -> TargetResult:
    """The target's files (kernel with provenance, drop-in, test, BENCHMARK.md), accepted only after the generated
    test passed on a scratch copy of the source tree (runner/results.py)."""
    from runner.report import trace_markdown

    best = outcome.best
    verdict = best.verdict if best else None
    with tempfile.TemporaryDirectory(prefix="fusebot-check-", dir=workdir) as scratch:
        shutil.copytree(source_dir, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return target_result(dropin_spec(spec), outcome.improved, outcome.message, best.candidate if best else None,
                             verdict, Provenance.for_verdict(target.name, verdict, repo=job.repo, commit=job.sha),
                             trace_markdown(outcome), root=Path(scratch), kernels_dir=kernels_dir, file=target.file)


def run_job(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, proposers: Sequence | None = None,
            backend: str | None = None, workdir: Path | None = None) -> JobResult:
    if job.kind != "search":
        from runner.remeasure import run_kernel_job

        log.info("job %s: %s of the kernels under %s", job.id, job.kind, job.kernels_dir)
        return run_kernel_job(job, Path(source_dir), progress, backend=backend, workdir=workdir)
    from runner.evaluate import Evaluator, default_backend
    from runner.optimize_cli import make_proposers, optimize_problem

    chosen = backend or default_backend()
    pool = list(proposers) if proposers is not None else make_proposers(job.models)
    results: list[TargetResult] = []
    environment = None
    with tempfile.TemporaryDirectory(prefix=f"fusebot-job-{job.id}-", dir=workdir) as tmp:
        for target in job.targets:
            spec = problem_spec(target, Path(source_dir))
            out = Path(tmp) / target.name
            try:
                with Evaluator(spec, backend=chosen) as ev:
                    outcome = optimize_problem(spec, out, job.budget, pool, ev, chosen, progress=progress)
                    environment = environment or ev.environment()
            except ProblemError as exc:
                log.warning("target %s: %s", target.name, exc)
                results.append(TargetResult(target=target.name, improved=False, message=f"problem: {exc}"))
                continue
            results.append(accepted_result(job, target, spec, outcome, Path(source_dir), workdir))
    return JobResult(job_id=job.id, ok=True, targets=results, environment=environment)
