"""The one path from a problem to its result folder, and from a job to its JobResult.

`optimize_problem` searches one problem (or resumes the search recorded in its folder) and writes the result folder:
trace.jsonl, report.md, result.json and, when a verified kernel beat the faster of eager and torch.compile, the kernel,
its drop-in module and test. `run_job` does that for every target of a job from the bot or the Action: a broken target
(its module fails to import, its reference fails) is reported on that target and the others still run; a broken
machine raises. Benchmark and hygiene jobs search nothing: runner/results/remeasure.py re-verifies and re-times the
kernels in the commit. `fusebot optimize`, `fusebot bench`, `fusebot worker`, the Action and the demo all call here.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import threading
from collections import deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import torch
from pydantic import ValidationError

from runner.contract import Backend, Job, JobResult, ProblemSpec, Progress, SearchBudget, TargetResult, TargetSpec
from runner.errors import ProblemError, UsageError
from runner.harness import dropin
from runner.harness.config import confirm_rounds_setting
from runner.harness.evaluator import default_backend
from runner.harness.gpus import device_evaluators, lanes, parse_gpus, visible_gpus
from runner.proposers.catalog import catalog_proposers, skips_work
from runner.proposers.llm.inputs import describe_inputs
from runner.proposers.llm.proposer import LLMSettings, llm_proposers
from runner.proposers.rewrite.proposer import rewrite_proposers
from runner.results.choice import confirm_finalists
from runner.results.dropin_test import TEST_FILE, dropin_test_source
from runner.results.files import DEFAULT_KERNELS_DIR, Provenance, target_result
from runner.results.outcome import Outcome, outcome, proposal, report_markdown, result_json, trace_markdown
from runner.results.remeasure import KERNEL_JOBS, run_kernel_job
from runner.results.shapes import calls as shape_calls
from runner.results.shapes import verified_inputs
from runner.search.cutoff import within
from runner.search.deadline import Cancelled, Deadline, plan_split
from runner.search.loop import EvaluatorLike, search
from runner.search.overlap import BaselinesAhead
from runner.search.pool import is_remote
from runner.search.trace import read_events
from runner.search.triage import at_floor, no_search
from runner.search.types import BudgetExhausted, GpuInfo, ProblemContext, Proposer

log = logging.getLogger(__name__)

# A job target's budget keeps this share for what follows the confirmation: the drop-in's own test and its bench
# script, each given what is left of the budget but never less than FINISH_FLOOR_S (cut shorter, they would throw
# away a verified kernel for want of seconds).
FINISH_SHARE = 0.1
FINISH_FLOOR_S = 60.0


def finish_timeout_s(deadline: Deadline) -> float:
    """What the drop-in's test and the bench script are each given: what is left of the target's `deadline`, never
    less than FINISH_FLOOR_S."""
    return max(FINISH_FLOOR_S, deadline.left_s())


def search_deadline(deadline: Deadline) -> Deadline:
    """The part of a target's `deadline` that the capture, baselines, search and confirmation get: all but
    FINISH_SHARE, kept for the drop-in's test and the bench script."""
    return deadline.until(deadline.seconds * (1 - FINISH_SHARE))


def problem_from_file(path: Path, **overrides) -> ProblemSpec:
    """A KernelBench-format file. A `get_second_inputs()` beside `get_inputs()` declares a second shape."""
    text = path.read_text()
    second = "get_second_inputs" if "def get_second_inputs" in text else None
    fields = {k: v for k, v in overrides.items() if v is not None}
    return ProblemSpec(name=path.stem, path=str(path.resolve()), second_inputs=second, **fields)


TRACE_FILE = "trace.jsonl"
GENERATED = (dropin.DROPIN_FILE, TEST_FILE, dropin.REFERENCE_FILE, dropin.HEADER_FILE, "kernel.cpp",
             "kernel.cu", "candidate.py")


# ---- proposers -------------------------------------------------------------------------------------------------

def make_proposers(models: Sequence[str], *, builtin: bool = True) -> list[tuple[Proposer, float]]:
    """The builtin catalog and the source rewrites, and beside them every configured model when an endpoint is
    configured (FUSEBOT_LLM_* or --model): one population, the catalog's kernels the first beam the models refine
    (runner/search/loop.py). `builtin=False` leaves the models alone (to try a model by itself)."""
    pool: list[tuple[Proposer, float]] = []
    if builtin:
        pool += [(p, 1.0) for p in catalog_proposers()]
        pool += [(p, 0.0) for p in rewrite_proposers()]  # source rewrites: their own first-round quota, no share
    if models or os.environ.get("FUSEBOT_LLM_BASE_URL"):
        try:
            settings = LLMSettings(**({"models": ",".join(models)} if models else {}))
        except ValidationError as e:
            problems = "; ".join(f"FUSEBOT_LLM_{'_'.join(map(str, err['loc'])).upper()}: {err['msg']}"
                                 for err in e.errors())
            raise UsageError(f"LLM settings are invalid: {problems}") from None
        pool += llm_proposers(settings)
    if not pool:
        raise UsageError("--no-builtin leaves no proposer: configure a model (FUSEBOT_LLM_BASE_URL, --model)")
    return pool


# ---- the run ---------------------------------------------------------------------------------------------------

def kernelbench_aliases(spec: ProblemSpec) -> str:
    """Lines that give a repository target KernelBench's names (Model, get_inputs, get_init_inputs), so that every
    proposer reads one convention whatever the module calls its class and factories."""
    lines = []
    kwargs = dict(spec.init_kwargs)
    if spec.class_name != "Model" or kwargs:
        lines.append(f"Model = {spec.class_name}" if not kwargs else
                     f"def Model(*args):\n    return {spec.class_name}(*args, **{kwargs!r})")
    if spec.input_shapes:
        dtype = spec.dtype or "float32"
        lines.append(f"def get_inputs():\n    import torch\n    return [torch.rand(s, dtype=torch.{dtype}) for s in "
                     f"{[list(x) for x in spec.input_shapes]!r}]")
    elif spec.inputs != "get_inputs" and ":" not in spec.inputs:
        lines.append(f"get_inputs = {spec.inputs}")
    if spec.init_args:
        lines.append(f"def get_init_inputs():\n    return {list(spec.init_args)!r}")
    elif spec.init_inputs and spec.init_inputs != "get_init_inputs" and ":" not in spec.init_inputs:
        lines.append(f"get_init_inputs = {spec.init_inputs}")
    elif not spec.init_inputs:
        lines.append("def get_init_inputs():\n    return []")
    return ("\n\n\n# fusebot: this target under KernelBench's names\n" + "\n\n\n".join(lines) + "\n") if lines else ""


def problem_context(spec: ProblemSpec, evaluator, backend: Backend, *, describe: bool = False,
                    baselines: bool = True) -> ProblemContext:
    """What the proposers may know, from the harness: reference, baselines (unless not `baselines`), roofline,
    device; with `describe`, the table of every shape set's arguments the models' prompts show (a confined child
    process: seconds)."""
    source = evaluator.reference_source()  # (this starts the judge)
    measured = evaluator.baselines() if baselines else None
    source += kernelbench_aliases(spec)
    roofline = evaluator.roofline()
    env = evaluator.environment()
    specs, limits = "", {}
    if backend == "cuda":
        p = torch.cuda.get_device_properties(0)
        l2 = getattr(p, "L2_cache_size", 0)
        specs = f"{p.multi_processor_count} SMs, {l2 / 2**20:.0f} MB L2, {p.total_memory / 2**30:.0f} GiB, " \
                f"compute capability {p.major}.{p.minor}"
        limits = dict(cuda_arch=f"sm_{p.major}{p.minor}", sm_count=p.multi_processor_count, l2_bytes=l2 or None,
                      smem_per_block_bytes=getattr(p, "shared_memory_per_block_optin", None),
                      smem_per_sm_bytes=getattr(p, "shared_memory_per_multiprocessor", None),
                      regs_per_sm=getattr(p, "regs_per_multiprocessor", None),
                      max_threads_per_sm=getattr(p, "max_threads_per_multi_processor", None))
    gpu = GpuInfo(name=env.gpu or env.cpu or env.device, specs=specs,
                  copy_bandwidth_bytes_per_s=roofline.bandwidth_bytes_per_s if roofline else None,
                  notes=f"CUDA {env.cuda}, driver {env.driver}" if env.cuda else "", **limits)
    return ProblemContext(name=spec.name, reference_source=source, backend=backend, format="fast", gpu=gpu,
                          roofline=roofline, baselines=measured, inputs=describe_inputs(spec) if describe else [])


def _check_trace(trace: Path, spec: ProblemSpec, backend: str, fresh: bool) -> None:
    if fresh:
        trace.unlink(missing_ok=True)
        return
    for ev in read_events(trace):
        if ev.get("event") in ("start", "resume"):
            if (ev.get("problem"), ev.get("backend")) != (spec.name, backend):
                raise UsageError(f"{trace} belongs to a search of {ev.get('problem')} on {ev.get('backend')}; "
                                 "use --fresh or another --out")
            log.info("resuming the search recorded in %s", trace)
            return


def write_outputs(out: Path, spec: ProblemSpec, o: Outcome, problem_file: Path | None) -> list[str]:
    """Write the result folder; a kernel (and its drop-in and test) only when it beat both baselines."""
    for name in GENERATED:  # a previous run's kernel must not outlive a run that found none
        (out / name).unlink(missing_ok=True)
    for pattern in ("kernel.*.so.b64", "kernel.*.cubin.b64", "kernel.compute_*.ptx"):  # what a drop-in ships
        for shipped in out.glob(pattern):
            shipped.unlink()
    files: list[str] = []
    cand = o.best.candidate if o.improved and o.best else None
    if cand is not None:
        for name, text in cand.sources.items():
            (out / name).write_text(text)
            files.append(name)
        if cand.format == "fast":
            (out / dropin.HEADER_FILE).write_text((Path(__file__).parent / "csrc" / "fusebot.h").read_text())
            files.append(dropin.HEADER_FILE)
            if problem_file is not None:
                shutil.copyfile(problem_file, out / dropin.REFERENCE_FILE)
                files.append(dropin.REFERENCE_FILE)
            digest = hashlib.sha256("".join(cand.sources.values()).encode()).hexdigest()
            calls = shape_calls(verified_inputs(spec)) if cand.backend == "cuda" else []  # its launch plans' calls
            for name, text in dropin.dropin_files(spec, cand, digest, calls=calls).items():  # the drop-in, its code
                (out / name).write_text(text)
                files.append(name)
            (out / TEST_FILE).write_text(dropin_test_source(spec, cand.backend))
            files.append(TEST_FILE)
    files += ["report.md", "result.json"]
    (out / "report.md").write_text(report_markdown(o))
    (out / "result.json").write_text(json.dumps(result_json(o, files), indent=1))
    return files


def baselines_note(compile_baseline: bool = True) -> str:
    """What the first minute of a search does, said before it starts: the user's module starts and its baselines
    (the times to beat) are measured."""
    timed = "eager and torch.compile" if compile_baseline else "eager"
    return f"timing {timed} (once per problem and machine)"


def optimize_problem(spec: ProblemSpec, out: Path, budget: SearchBudget, proposers: Sequence,
                     evaluator: EvaluatorLike, backend: Backend, *, fresh: bool = False,
                     progress: Callable[[Progress], None] | None = None, confirm_rounds: int | None = None,
                     deadline: Deadline | None = None, reserve_s: float = 0.0,
                     skips: Callable[[ProblemContext], bool] = skips_work, compile_baseline: bool = True) -> Outcome:
    """Search (or resume the search recorded in out/trace.jsonl) and write the result folder, all within
    `budget.wall_seconds` from now (or `deadline`: runner/search/deadline.py), capture and baselines included, less
    `reserve_s` kept at its end for what follows (a command's exit). A step of the setup (the judge's start, the
    capture, the baselines) still running when the budget (less the reserve) ends is cut off, and the outcome says
    so. A
    cancelled deadline raises `Cancelled`. No search where the faster baseline already runs at the memory floor and
    `skips` finds no work a kernel could skip (triage): for a problem with a memory floor the baselines are then
    waited for before the search starts (the capture runs beside them); without one they are timed beside the
    catalog's first builds. `progress` hears the budget's split, then what the first minute does (baselines_note:
    `compile_baseline` says whether torch.compile is timed too). The finalists are confirmed in `confirm_rounds`
    alternating rounds (None: the FUSEBOT_CONFIRM_ROUNDS setting, validated here before anything starts)."""
    rounds = confirm_rounds if confirm_rounds is not None else confirm_rounds_setting(os.environ)
    deadline = deadline or Deadline(budget.wall_seconds)
    split = plan_split(deadline.seconds, reserve_s=reserve_s)
    work = deadline.until(split.work_end_s)
    log.info("%s", split.announce())
    if progress:
        progress(Progress(message=split.announce()))
        progress(Progress(message=baselines_note(compile_baseline)))
    out.mkdir(parents=True, exist_ok=True)
    trace = out / TRACE_FILE
    _check_trace(trace, spec, backend, fresh)
    models = any(is_remote(p[0] if isinstance(p, tuple) else p) for p in proposers)
    setup = _Setup(spec, evaluator, backend, models, skips)
    try:
        # until the confirmation's end, not the search's: baselines that finish late still reach the cache
        ctx, evaluator, why = within(work, setup.run, "starting")
    except BudgetExhausted as e:
        return _cut_off_in_setup(spec, out, evaluator, setup, deadline, e)
    except (Cancelled, KeyboardInterrupt):  # the judge is killed, not waited for, wherever its setup had got to
        _stop(evaluator)
        raise
    if why:
        log.info("%s: %s", spec.name, why)
        o = replace(outcome(spec.name, no_search("at-floor"), ctx.baselines, ctx.roofline), message=why)
        write_outputs(out, spec, o, Path(spec.path) if spec.path else None)
        return o
    setup_s = deadline.elapsed_s()
    if setup_s >= split.search_end_s:
        log.warning("the reference's start%s took %.0f s of the %g s budget: no time is left for the search (a "
                    "rerun reads the baselines from the cache)", "" if ctx.baselines is None else " and baselines",
                    setup_s, deadline.seconds)
    else:
        log.info("the reference's start%s took %.1f s of the budget; the search has until %.0f s",
                 " (its baselines are timed beside the first builds)" if ctx.baselines is None else " and baselines",
                 setup_s, split.search_end_s)
    result = search(ctx, evaluator, proposers, budget, trace, progress=progress,
                    deadline=work.until(split.search_end_s))
    # The fastest of many noisy measurements is partly the luckiest: the best kernel and the best PyTorch rewrite are
    # re-timed against both baselines, and the outcome proposes one of them, or nothing.
    confirmed, confirmed_rewrite = confirm_finalists(result, evaluator, rounds, progress, work)
    if ctx.baselines is None:  # timed beside the search: waited for only as long as the budget lasts
        try:
            ctx = ctx.model_copy(update={"baselines": within(work, evaluator.baselines, "timing the baselines")})
        except BudgetExhausted:
            log.warning("the baselines were still being timed when the budget ran out: the outcome has none")
            _stop(evaluator)
    o = outcome(spec.name, result, ctx.baselines, ctx.roofline, confirmed=confirmed,
                confirmed_rewrite=confirmed_rewrite)
    write_outputs(out, spec, o, Path(spec.path) if spec.path else None)
    return o


class _Setup:
    """What a search needs before it starts, one step after another (`stage` says which is running, for the message
    of a cut-off): the judge's start and the problem's context, then, for triage, the catalog's capture while the
    baselines are timed."""

    def __init__(self, spec: ProblemSpec, evaluator, backend: Backend, models: bool,
                 skips: Callable[[ProblemContext], bool]) -> None:
        self.spec, self.evaluator, self.backend, self.models, self.skips = spec, evaluator, backend, models, skips
        self.stage = "starting the reference"

    def run(self) -> tuple[ProblemContext, EvaluatorLike, str | None]:
        """(the context, the evaluator the search uses, the reason to spend no search or None)."""
        evaluator = self.evaluator
        if self.models:
            self.stage = "starting the reference and timing the baselines"
        ctx = problem_context(self.spec, evaluator, self.backend, describe=self.models, baselines=self.models)
        if ctx.baselines is None:  # timed from now on, beside the capture and the catalog's first builds
            evaluator = BaselinesAhead(evaluator)
        if ctx.roofline is None:
            return ctx, evaluator, None
        self.stage = "capturing the module"
        if self.skips(ctx):  # a kernel may skip work: searched whatever the baselines
            return ctx, evaluator, None
        if ctx.baselines is None:
            self.stage = "timing the baselines"
            ctx = ctx.model_copy(update={"baselines": evaluator.baselines()})
        return ctx, evaluator, at_floor(ctx.baselines, ctx.roofline, skips=False)


def _stop(evaluator) -> None:
    """Kill the evaluator's processes now (a step of it was cut off): its close then waits for nothing."""
    stop = getattr(evaluator, "stop", None)
    if stop is not None:
        stop()


def _cut_off_in_setup(spec: ProblemSpec, out: Path, evaluator, setup: _Setup, deadline: Deadline,
                      stop: BudgetExhausted) -> Outcome:
    _stop(evaluator)
    message = (f"the budget ran out while {setup.stage} ({deadline.elapsed_s():.0f} s of {deadline.seconds:g} s): no "
               "search was run; a larger budget lets it finish (baselines, once timed, are cached for the next run)")
    log.warning("%s: %s", spec.name, message)
    o = replace(outcome(spec.name, no_search(f"budget: {stop}"), None, None), message=message)
    write_outputs(out, spec, o, Path(spec.path) if spec.path else None)
    return o


# ---- a job ----------------------------------------------------------------------------------------------------

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
                    workdir: Path | None, kernels_dir: str = DEFAULT_KERNELS_DIR,
                    timeout_s: float | None = None) -> TargetResult:
    """The target's files (kernel with provenance, drop-in, test, BENCHMARK.md), accepted only after the generated
    test passed on a scratch copy of the source tree (runner/results/files.py)."""
    best = outcome.best
    verdict = best.verdict if best else None
    with tempfile.TemporaryDirectory(prefix="fusebot-check-", dir=workdir) as scratch:
        shutil.copytree(source_dir, scratch, dirs_exist_ok=True, ignore=shutil.ignore_patterns(".git"))
        return target_result(dropin_spec(spec), outcome.improved, outcome.message, best.candidate if best else None,
                             verdict, Provenance.for_verdict(target.name, verdict, repo=job.repo, commit=job.sha),
                             trace_markdown(outcome), root=Path(scratch), kernels_dir=kernels_dir, file=target.file,
                             timeout_s=timeout_s, **proposal(outcome))


class _Combined:
    """Progress of targets searched at once, as one: counts summed, the best speedup over them, the furthest round."""

    def __init__(self, progress: Callable[[Progress], None], targets: int) -> None:
        self.progress, self.targets, self.latest, self.lock = progress, targets, {}, threading.Lock()

    def for_target(self, i: int) -> Callable[[Progress], None]:
        def report(p: Progress) -> None:
            with self.lock:
                self.latest[i] = p
                ps = list(self.latest.values())
            best = [x.best_speedup for x in ps if x.best_speedup is not None]
            self.progress(Progress(round=max(x.round for x in ps), built=sum(x.built for x in ps),
                                   verified=sum(x.verified for x in ps), rejected=sum(x.rejected for x in ps),
                                   best_speedup=max(best) if best else None,
                                   message=f"{len(ps)} of {self.targets} targets started: {p.message}"[:300]))
        return report


def _search_target(job: Job, target: TargetSpec, source_dir: Path, tmp: Path, pool: Sequence, backend: str,
                   devices: list[int], total: int, workdir: Path | None,
                   progress: Callable[[Progress], None], cancel: threading.Event) -> tuple[TargetResult, object]:
    """One target within its budget: the search and its confirmation, then the drop-in's test and bench script."""
    spec = problem_spec(target, source_dir)
    deadline = Deadline(job.budget.wall_seconds, cancel=cancel)
    try:
        with device_evaluators(spec, backend, devices, total=total) as ev:
            outcome = optimize_problem(spec, tmp / target.name, job.budget, pool, ev, backend, progress=progress,
                                       deadline=search_deadline(deadline))
            environment = ev.environment()
    except ProblemError as exc:
        log.warning("target %s: %s", target.name, exc)
        return TargetResult(target=target.name, improved=False, message=f"problem: {exc}"), None
    return accepted_result(job, target, spec, outcome, source_dir, workdir,
                           timeout_s=finish_timeout_s(deadline)), environment


def job_devices(backend: str, gpus: Sequence[int] | None = None) -> list[int]:
    """The GPUs a job runs on: `gpus`, else FUSEBOT_GPUS (all, or 0,1: the host's choice), else every visible one;
    on the CPU backend none unless given (each given device then a slice of the cores, docs/scaling.md)."""
    if backend != "cuda":
        return list(gpus) if gpus is not None else []
    return list(gpus) if gpus is not None else parse_gpus(os.environ.get("FUSEBOT_GPUS"), visible_gpus())


def proposer_pools(job: Job, backend: str | None = None, gpus: Sequence[int] | None = None) -> list[list]:
    """One pool of proposers for each search `run_job` runs at once on this host (the Action makes them before the
    LLM key leaves its environment, then passes them as `proposer_pools`)."""
    devices = job_devices(backend or default_backend(), gpus)
    return [make_proposers(job.models) for _ in lanes(devices, max(1, len(job.targets)))]


def run_job(job: Job, source_dir: Path, progress: Callable[[Progress], None], *, proposers: Sequence | None = None,
            backend: str | None = None, workdir: Path | None = None, gpus: Sequence[int] | None = None,
            proposer_pools: Sequence[Sequence] | None = None, cancel: threading.Event | None = None) -> JobResult:
    """Every target of the job, on every device in `gpus` (default: FUSEBOT_GPUS, else every visible GPU; none on
    the CPU backend).
    With several devices, targets are searched at once, a search per device, or several devices per search when they
    outnumber the targets (runner/harness/gpus.py `lanes`); each search evaluates its candidates on all its devices.
    Searches at once need proposers each: `proposer_pools` (one pool per search), else pools made here from
    `job.models`; a single `proposers` pool searches the targets one after another, over all the devices.
    `cancel` (else the `cancel` event a progress sink may carry: the worker's) stops every search at once: no new
    proposer call or candidate process is started, the evaluations in flight are cut off, and `Cancelled` is raised."""
    if job.kind in KERNEL_JOBS:
        log.info("job %s: %s of the kernels under %s", job.id, job.kind, job.kernels_dir)
        return run_kernel_job(job, Path(source_dir), progress, backend=backend, workdir=workdir)
    chosen = backend or default_backend()
    devices = job_devices(chosen, gpus)
    pools = [list(p) for p in proposer_pools] if proposer_pools else [list(proposers)] if proposers is not None else None
    plan = lanes(devices, len(job.targets) if pools is None else min(len(job.targets), len(pools)))
    pools = pools or [make_proposers(job.models) for _ in plan]
    cancel = cancel or getattr(progress, "cancel", None) or threading.Event()
    results: list[TargetResult | None] = [None] * len(job.targets)
    environments: dict[int, object] = {}
    todo = deque(enumerate(job.targets))
    lock = threading.Lock()
    combined = _Combined(progress, len(job.targets))
    with tempfile.TemporaryDirectory(prefix=f"fusebot-job-{job.id}-", dir=workdir) as tmp:

        def lane(k: int) -> None:
            while True:
                with lock:
                    if not todo:
                        return
                    i, target = todo.popleft()
                report = progress if len(plan) == 1 else combined.for_target(i)
                results[i], env = _search_target(job, target, Path(source_dir), Path(tmp), pools[k], chosen, plan[k],
                                                 len(devices), workdir, report, cancel)
                if env is not None:
                    environments[i] = env

        if len(plan) == 1:
            lane(0)
        else:
            log.info("job %s: %d targets, %d searches at once on %s", job.id, len(job.targets), len(plan), plan)
            with ThreadPoolExecutor(len(plan), thread_name_prefix="search") as ex:
                for f in [ex.submit(lane, k) for k in range(len(plan))]:
                    f.result()
    environment = environments[min(environments)] if environments else None
    return JobResult(job_id=job.id, ok=True, targets=[r for r in results if r is not None], environment=environment)
