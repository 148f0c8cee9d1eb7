"""The evaluator: build, verify and time candidates for one problem, each in its own confined process.

    with Evaluator(problem_spec, backend="cuda") as ev:
        verdict = ev.evaluate(candidate)

The parent holds the secret the trial seeds come from and never imports user code or candidate code. The judge
process holds the reference (runner.harness.reference); each candidate gets a fresh process
(runner.harness.contestants). A candidate that fails in any way yields a Verdict with reasons; a broken problem
raises ProblemError; a broken machine raises MachineError.

This module orchestrates the stages: plan (the trials), build, load, verify (runner.harness.trials, checks),
time (runner.harness.measure) and confirm (runner.harness.confirm).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from runner.contract import (
    CUT_OFF,
    Baselines,
    BuildInfo,
    Candidate,
    Environment,
    ProblemSpec,
    Roofline,
    Timing,
    Verdict,
)
from runner.harness import build as builder
from runner.harness import clocked
from runner.harness import confirm as confirming
from runner.harness.checks import static_checks
from runner.harness.config import HarnessConfig, scratch_root
from runner.harness.contestants import Contestants
from runner.harness.measure import measure, score, time_candidate, warn_if_degenerate
from runner.harness.plan import Seeds, trial_plan
from runner.harness.prebuild import Prebuilds
from runner.harness.procs import threads
from runner.harness.procs.process import Child
from runner.harness.reference import Reference
from runner.harness.trials import verify

__all__ = ["Evaluator", "HarnessConfig", "default_backend"]



def default_backend() -> str:
    try:
        import torch

        return "cuda" if torch.cuda.is_available() else "cpu"
    except ImportError:
        return "cpu"


@dataclass
class Run:
    """One candidate on its way through the harness."""

    candidate: Candidate
    verdict: Verdict
    child: Child | None = None
    library: Path | None = None
    cut: bool = False  # unfinished when its evaluation was aborted: its verdict says "cut off", whatever else it says

    @contextlib.contextmanager
    def stage(self, name: str):
        t0 = time.monotonic()
        try:
            yield
        finally:
            secs = self.verdict.stage_seconds
            secs[name] = secs.get(name, 0.0) + time.monotonic() - t0

    def finish(self) -> Verdict:
        """harness_seconds: the time spent on this candidate alone (its stages), not time it waited on others. The
        verdict leaves validated again: text a candidate wrote into it is made inert (runner.contract.inert)."""
        self.verdict.harness_seconds = sum(self.verdict.stage_seconds.values())
        return Verdict.model_validate(self.verdict.model_dump())


class Evaluator:
    def __init__(self, problem: ProblemSpec, *, backend: str | None = None, compile_baseline: bool = True,
                 workdir: Path | None = None, config: HarnessConfig | None = None):
        # Children run in their own directories: every path they get is absolute.
        absolute = {k: str(Path(v).resolve()) for k in ("path", "root") if (v := getattr(problem, k))}
        self.problem = problem.model_copy(update=absolute)
        self.backend = backend or default_backend()
        self.config = config or HarnessConfig(compile_baseline=compile_baseline)
        if config is None:
            self.config.compile_baseline = compile_baseline
        self.device = "cuda" if self.backend == "cuda" else "cpu"
        self.seeds = Seeds()
        self._own_workdir = workdir is None
        self.workdir = Path(workdir or tempfile.mkdtemp(prefix="fusebot-eval-", dir=scratch_root()))
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.cache_dir = Path(self.config.cache_dir or builder.default_cache_dir().parent)
        self.reference = Reference(self.problem, self.device, self.config, self.seeds, self.workdir, self.cache_dir)
        self.contestants = Contestants(self.problem, self.device, self.config, self.seeds, self.workdir,
                                       self.cache_dir)
        self._cuda_arch: str | None = None
        self._generation = self._aborted_generation = 0  # evaluate_many calls so far; the last one aborted
        self._ahead = Prebuilds(os.cpu_count() or 1) if self.backend == "cuda" else None
        self._live: list[Run] = []

    # ---- lifecycle -------------------------------------------------------------------------------------------

    def __enter__(self) -> Evaluator:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self._ahead is not None:
            self._ahead.close()
        self.contestants.close()
        self.reference.close()
        if self._own_workdir and not self.config.keep_workdirs:
            shutil.rmtree(self.workdir, ignore_errors=True)

    # ---- what the problem costs -------------------------------------------------------------------------------

    def reference_source(self) -> str:
        return self.reference.source()

    def environment(self, confinement: dict | None = None) -> Environment:
        return self.reference.environment(confinement)

    def baselines(self) -> Baselines:
        return self.reference.baselines()

    def roofline(self) -> Roofline | None:
        return self.reference.roofline()

    def reference_kernels(self) -> list[str]:
        return self.reference.kernels()

    def cuda_arch(self) -> str | None:
        if self.backend != "cuda":
            return None
        if self._cuda_arch is None:
            import torch  # the parent imports torch only where a CUDA candidate is built

            major, minor = torch.cuda.get_device_capability()
            self._cuda_arch = f"sm_{major}{minor}"
        return self._cuda_arch

    # ---- candidates ----------------------------------------------------------------------------------------------

    def plan(self, tag: str) -> list[dict]:
        self.reference.start()
        roofline = self.reference.known_roofline()
        return trial_plan(self.seeds, tag, trials=self.config.trials,
                          shape_sets=self.reference.info.get("shape_sets", 1),
                          large=roofline is not None and roofline.bytes_moved > self.config.large_io_bytes,
                          randn_trials=self.problem.randn_trials)

    def evaluate_many(self, candidates: list[Candidate]) -> list[Verdict]:
        """Build every candidate in parallel, start and load every candidate's process in parallel (on CUDA, from
        the spares started while the chunk before was verified), and only when all are loaded verify them, then time
        them, one at a time: the next chunk's spares warm up during the verifications and are warm before the first
        timing, so no process start, import or CUDA warm-up overlaps a measurement."""
        self._generation += 1
        gen = self._generation
        if self._ahead is not None:
            self._ahead.wait(candidates)
        builds = builder.build_many(candidates, cuda_arch=self.cuda_arch(), cache_dir=self.cache_dir / "build")
        if self._aborted_generation >= gen:  # aborted while building: no candidate process is started
            return [Run(c, Verdict(candidate_id=c.id, problem=self.problem.name, accepted=False, stage="build",
                                   reasons=[CUT_OFF])).finish() for c in candidates]
        runs = [self._begin(c, builds.get(c.id), tag="main") for c in candidates]
        self._live = runs
        try:
            for r in runs:
                self._loaded(self._unless_aborted(r, gen), runs)
            if self.device.startswith("cuda"):  # the next chunk's processes warm up while this one is verified
                self.contestants.prestart(len(candidates))
            for r in runs:
                self._verified(self._unless_aborted(r, gen), runs)
            self.contestants.settle()
            verdicts = [self._timed(self._unless_aborted(r, gen), runs) for r in runs]
        finally:
            self._live = []
        for r in runs:  # the one in flight when it was aborted may have died of it: cut off, not its own failure
            if r.cut and CUT_OFF not in r.verdict.reasons:
                r.verdict.reasons.append(CUT_OFF)
        return verdicts

    def prebuild(self, candidates: list[Candidate]) -> None:
        """Start building these candidates now, ahead of their evaluation (runner/harness/prebuild.py; CUDA only)."""
        if self._ahead is not None:
            self._ahead.start(candidates, lambda c: builder.build(c, cuda_arch=self.cuda_arch(),
                                                                  cache_dir=self.cache_dir / "build"))

    def abort(self) -> None:
        """Cut off the `evaluate_many` in flight (called from another thread: the budget ran out, or the job was
        cancelled): every candidate process of it is killed, and no other is started (a build in flight finishes,
        then nothing runs); their verdicts say so. The next `evaluate_many`, and `confirm`, run normally."""
        self._aborted_generation = self._generation
        for r in list(self._live):
            if r.child is not None:
                r.cut = True
                r.child.kill()

    def stop(self) -> None:
        """Kill every process of this evaluator now, the judge's too (a step it was taking when the budget ran out or
        the job was cancelled: the judge's start, the baselines): `close` then waits for none of them."""
        self.abort()
        child = self.reference._child  # noqa: SLF001 - the judge, killed as abort kills the candidates
        if child is not None:
            child.kill()

    def _unless_aborted(self, r: Run, gen: int) -> Run:
        if self._aborted_generation >= gen and r.child is not None:
            r.cut = True
            r.child.close()
            r.child = None
            r.verdict.reasons.append(CUT_OFF)
        return r

    def evaluate(self, candidate: Candidate, _build: builder.BuildOutput | None = None) -> Verdict:
        r = self._begin(candidate, _build, tag="main")
        self._loaded(r)
        return self._complete(r)

    def _begin(self, candidate: Candidate, build: builder.BuildOutput | None, tag: str) -> Run:
        """Build (fast format), refuse what static checks refuse, and start the candidate's process with its load
        request in flight. On failure the run's verdict holds the reasons and it has no child."""
        r = Run(candidate, Verdict(candidate_id=candidate.id, problem=self.problem.name, accepted=False,
                                   stage="build"))
        v = r.verdict
        if candidate.backend != self.backend:
            v.reasons.append(f"backend: a {candidate.backend} candidate cannot run on this {self.backend} harness")
            return r
        self.reference.start()
        with r.stage("build"):
            if candidate.format == "fast":
                out = build or builder.build(candidate, cuda_arch=self.cuda_arch(), cache_dir=self.cache_dir / "build")
                v.build = out.info
                if not out.info.ok:
                    v.reasons.append(f"build: {out.info.log.strip()[-3000:]}")
                    return r
                r.library = out.library
            else:
                v.build = BuildInfo(ok=True, seconds=0.0, compiler="torch.utils.cpp_extension (inside the run)")
        v.stage = "load"
        with r.stage("load"):
            v.reasons += static_checks(candidate)
            if not v.reasons:
                r.child = self.contestants.spawn(candidate, r.library, tag)
        return r

    def _loaded(self, r: Run, others: list[Run] = ()) -> None:
        """Wait for the run's process to load its candidate (enforcing every live child's memory cap meanwhile)."""
        if r.child is None:
            return
        with r.stage("load"):
            child, reasons, confinement = self.contestants.await_load(r.child, _siblings(r, others))
        r.verdict.environment = self.environment(confinement)
        if reasons:
            r.verdict.reasons += reasons
            if child is not None:
                child.close()
            r.child = None

    def _complete(self, r: Run, others: list[Run] = ()) -> Verdict:
        """Verify and time a loaded candidate; close its process."""
        self._verified(r, others)
        return self._timed(r, others)

    def _verified(self, r: Run, others: list[Run] = ()) -> bool:
        """Verify a loaded candidate; a rejected one's process is closed."""
        v = r.verdict
        if r.child is None:
            return False
        self.contestants.siblings = _siblings(r, others)
        try:
            v.stage = "verify"
            with r.stage("verify"):
                v.trials, reasons = verify(self.reference, self.contestants, r.child, r.candidate,
                                           self.plan(f"{r.candidate.id}/{self.seeds.counter}"))
        except BaseException:
            _close(r)
            raise
        finally:
            self.contestants.siblings = ()
        v.warnings += [n for t in v.trials for n in t.notes]
        if reasons:
            v.reasons += reasons
            _close(r)
        return r.child is not None

    def _timed(self, r: Run, others: list[Run] = ()) -> Verdict:
        """Time a verified candidate (one whose process is still open); close its process."""
        v = r.verdict
        if r.child is None:
            return r.finish()
        self.contestants.siblings = _siblings(r, others)
        try:
            v.stage = "time"
            with r.stage("time"):
                time_candidate(self.contestants, r.child, self.reference, v,
                               remeasure=lambda: self._remeasure(r.candidate, r.library))
            if not v.reasons:
                # the in-process guards' "all clear" travels in the candidate's own replies: the parent looks too
                left_running = threads.reason(r.child.proc.pid)
                if left_running:
                    v.reasons.append(left_running)
        finally:
            _close(r)
            self.contestants.siblings = ()
        if not v.reasons:
            v.accepted, v.stage = True, "done"
        return r.finish()

    def _remeasure(self, candidate: Candidate, library: Path | None) -> tuple[Timing | None, list[str]]:
        """Verify (one trial) and time a candidate again in a fresh process, on fresh inputs."""
        child, reasons, _ = self.contestants.start(candidate, library, tag="remeasure")
        if reasons:
            return None, reasons
        try:
            _, reasons = verify(self.reference, self.contestants, child, candidate,
                                self.plan(f"{candidate.id}/remeasure")[:1])
            if reasons:
                return None, reasons
            return measure(self.contestants, child, self.reference)
        finally:
            child.close()

    def confirm(self, candidate: Candidate, rounds: int = confirming.CONFIRM_ROUNDS,
                on_round: Callable[[int, float, float, float | None], bool] | None = None) -> Verdict:
        """Re-verify `candidate` in a fresh process, then time it and both baselines in alternating rounds
        (runner.harness.confirm). The returned verdict's timing and baselines pool every round's samples;
        `confirmation` keeps each round's medians and speedups. `on_round(n, candidate_ms, eager_ms, compile_ms)` hears of
        each round's medians as it ends; False stops the rounds there (the budget is spent)."""
        run = self._begin(candidate, None, tag="confirm")
        self._loaded(run)
        verdict, child = run.verdict, run.child
        if child is None:
            return run.finish()
        try:
            verdict.stage = "verify"
            with run.stage("verify"):
                # two trials, the problem's own inputs and a randn draw: a scalar loss is one number per trial, so
                # one trial alone cannot tell a loss from a constant (every loss was called degenerate on the H100)
                verdict.trials, reasons = verify(self.reference, self.contestants, child, candidate,
                                                 self.plan(f"{candidate.id}/confirm")[:2])
            if reasons:
                verdict.reasons += reasons
                return run.finish()
            verdict.stage = "time"
            cand, rounds_b = [], []
            for r in range(rounds):
                with run.stage("time"):
                    timing, reasons = measure(self.contestants, child, self.reference, raise_=False)
                if reasons:
                    verdict.reasons += reasons
                    return run.finish()
                cand.append(timing)
                rounds_b.append(self.reference.measure_baselines(f"confirm{r}"))
                b = rounds_b[-1]
                if on_round is not None and not on_round(
                        r + 1, timing.median_ms, b.eager.median_ms, b.compile.median_ms if b.compile else None):
                    break
            left_running = threads.reason(child.proc.pid)
            if left_running:
                verdict.reasons.append(left_running)
                return run.finish()
        finally:
            child.close()
        timing, baselines, verdict.confirmation = confirming.confirmation(clocked.common(cand), rounds_b)
        score(verdict, timing, baselines, self.roofline())
        warn_if_degenerate(verdict, self.reference)
        what = "the PyTorch rewrite" if candidate.rewrite else "the kernel"
        verdict.warnings.append(f"spread: {confirming.spread_text(verdict.confirmation, what)}")
        verdict.stage = "done"
        why = confirming.unstable(verdict.confirmation, self.config.unstable_spread, what)
        if why:
            verdict.reasons.append(f"unstable-measurement: {why}")
        verdict.accepted = not verdict.reasons
        return run.finish()


def _close(r: Run) -> None:
    if r.child is not None:
        r.child.close()
        r.child = None


def _siblings(r: Run, others) -> tuple[Child, ...]:
    return tuple(o.child for o in others if o is not r and o.child is not None)
