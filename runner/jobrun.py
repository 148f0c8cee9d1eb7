"""A job from the bot, run on this host: every target searched, its result folder read back into the JobResult.

`fusebot worker` calls `run_job` for each job it leases (runner/worker.py). A broken target (its module fails to
import, its reference fails) is reported on that target and the others still run; a broken machine raises.
"""

from __future__ import annotations

import logging
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from runner.contract import Job, JobResult, ProblemSpec, Progress, TargetResult, TargetSpec
from runner.errors import ProblemError

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


def _read_folder(out: Path, names: Sequence[str]) -> dict[str, str]:
    return {n: (out / n).read_text() for n in names if (out / n).is_file()}


def run_job(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, proposers: Sequence | None = None,
            backend: str | None = None, workdir: Path | None = None) -> JobResult:
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
            import json

            summary = json.loads((out / "result.json").read_text())
            best = outcome.best.verdict if outcome.best else None
            results.append(TargetResult(
                target=target.name, improved=outcome.improved, verdict=best, message=outcome.message,
                files=_read_folder(out, summary.get("files", [])),
                trace_markdown=(out / "report.md").read_text(),
            ))
    return JobResult(job_id=job.id, ok=True, targets=results, environment=environment)
