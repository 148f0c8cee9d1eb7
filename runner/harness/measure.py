"""Timing a verified candidate: its process times it with the shared timer, the parent bounds that time with its own
clock around back-to-back calls whose outputs it has checked (runner.harness.clocked), and a time under the
roofline's floor is measured again in a fresh process."""

from __future__ import annotations

import math
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from runner.contract import Baselines, Roofline, Timing, Verdict
from runner.harness import clocked
from runner.harness.checks import degenerate_reason
from runner.harness.config import HarnessConfig
from runner.harness.contestants import Contestants, died_label, tail
from runner.harness.procs.process import Worker, WorkerDied
from runner.harness.reference import Reference
from runner.harness.trials import judged


def score(verdict: Verdict, timing: Timing, baselines: Baselines, roofline: Roofline | None) -> None:
    """Put a timing and what it is compared with into the verdict: speedups over each baseline, % of the floor."""
    verdict.timing, verdict.baselines, verdict.roofline = timing, baselines, roofline
    if baselines.eager:
        verdict.speedup_vs_eager = baselines.eager.median_ms / timing.median_ms
    if baselines.compile:
        verdict.speedup_vs_compile = baselines.compile.median_ms / timing.median_ms
    if roofline:
        verdict.pct_of_floor = 100.0 * roofline.floor_ms / timing.median_ms


def warn_if_degenerate(verdict: Verdict, ref: Reference) -> None:
    why = degenerate_reason(ref.digests)
    if why:
        verdict.degenerate = True
        verdict.warnings.append(f"degenerate: {why}; no speedup on it is reported as real")


def measure(contestants: Contestants, worker: Worker, ref: Reference) -> tuple[Timing | None, list[str]]:
    """The candidate's time on the problem's first shape. Every timed call had fresh inputs; the judge checks a
    sample of the outputs of timed calls chosen after the last one; the parent's own clock cross-checks the time."""
    config = contestants.config
    seed = contestants.seeds.seed(f"time{contestants.seeds.counter}")
    try:
        specs, structure = ref.out_specs[0]  # timing runs on the first shape, whatever the last trial was
        rep = contestants.ask(worker, {"cmd": "time", "seed": seed, "out_specs": specs, "structure": structure},
                              config.time_timeout_s)
    except WorkerDied as exc:
        return None, [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
    if not rep.get("ok"):
        return None, [contestants.fault("timing", rep)]
    if rep.get("reasons"):
        return None, rep["reasons"]
    timing = Timing(**rep["timing"])
    if rep.get("samples") is not None:
        check = judged(ref, contestants, {"cmd": "timed_check", "seed": seed, "samples": rep["samples"],
                                          "dir": str(worker.workdir)}, config.trial_timeout_s, "timed_check")
        for s in rep["samples"]:
            for o in s.get("outputs") or []:
                if isinstance(o, dict) and o.get("file") and Path(o["file"]).resolve().is_relative_to(
                        Path(worker.workdir).resolve()):
                    Path(o["file"]).unlink(missing_ok=True)
        if isinstance(check, str):
            return None, [check]
        if check["reasons"]:
            return None, check["reasons"]
    return cross_check(contestants, worker, ref, timing, seed)


def _process_cpu_seconds(pid: int) -> float:
    """CPU time of process `pid`, all its threads (live and exited), in nanoseconds' resolution: its CPU-time clock
    (clock_getcpuclockid's clock id, (~pid << 3) | CPUCLOCK_SCHED). /proc's accounting, psutil's, is in 10 ms ticks,
    too coarse for a batch of a few hundred short calls."""
    try:
        return time.clock_gettime((~pid << 3) | 2)
    except OSError:
        return sum(psutil.Process(pid).cpu_times()[:2])


def _cpu_seconds(worker: Worker | None) -> float:
    """CPU time (user + system) of the worker's process tree so far, by the kernel's accounting."""
    try:
        top = psutil.Process(worker.proc.pid)
        return sum(_process_cpu_seconds(q.pid) for q in [top, *top.children(recursive=True)])
    except (psutil.Error, AttributeError):
        return 0.0


def _cores(worker: Worker) -> int:
    """How many cores the worker may run on (its affinity: the pinned set where the harness pins one)."""
    try:
        return max(1, len(psutil.Process(worker.proc.pid).cpu_affinity()))
    except (psutil.Error, AttributeError):
        return max(1, len(os.sched_getaffinity(0)))


def _timed(ask, worker: Worker | None) -> tuple[dict, float, float]:
    """(reply, wall ms by the parent's clock, CPU ms of the worker's processes) of one request."""
    c0, t0 = _cpu_seconds(worker), time.perf_counter()
    reply = ask()
    return reply, (time.perf_counter() - t0) * 1e3, (_cpu_seconds(worker) - c0) * 1e3


# Calls of the judge's steps the parent times first, to learn what a batch's steps cost a call
PROBE_CALLS = 4


def batch_calls(median_ms: float, step_ms: float, config: HarnessConfig, cuda: bool) -> int:
    """Calls in each parent-clocked batch: as many as fill the check's span (`wall_check_ms` on CUDA, `cpu_check_ms`
    on the CPU) at what a call of the batch costs the parent, the timed time plus its steps (fresh inputs and a
    fingerprint: 0.1-16 ms a call on the CPU, above the call itself for an elementwise kernel), at least 3 and at most
    the cap (`batch_calls_cuda`, `batch_calls_cpu`). Sized from the timed time alone, a 10 us kernel got 20000 calls
    of 0.1-100 ms each, six batches a measurement."""
    span_ms = config.wall_check_ms if cuda else config.cpu_check_ms
    cap = config.batch_calls_cuda if cuda else config.batch_calls_cpu
    return max(3, min(cap, math.ceil(span_ms / max(median_ms + step_ms, 1e-3))))


def cross_check(contestants: Contestants, worker: Worker, ref: Reference, timing: Timing,
                seed: int) -> tuple[Timing | None, list[str]]:
    """The time that counts (runner.harness.clocked): the parent times three batches of back-to-back calls in the
    candidate's process (each output fingerprinted), and the same steps without the calls in the judge's; then it
    draws one call of each batch, whose fingerprints the judge checks against the oracle on that call's inputs."""
    cuda = contestants.device == "cuda"
    timeout_s = contestants.config.time_timeout_s
    specs, _ = ref.out_specs[0]
    full, steps, checks = [], [], []
    try:
        probe = {"cmd": "steps", "seed": seed, "calls": PROBE_CALLS, "out_specs": specs,
                 "weights_seed": secrets.randbelow(1 << 62)}
        _, probe_ms, _ = _timed(lambda: ref.ask(probe, timeout_s, "steps"), None)
        calls = batch_calls(timing.median_ms, probe_ms / PROBE_CALLS, contestants.config, cuda)
        for _ in range(3):
            first, weights_seed = 1 + secrets.randbelow(1 << 40), secrets.randbelow(1 << 62)
            msg = {"cmd": "batch", "calls": calls, "first": first, "weights_seed": weights_seed}
            rep, wall, cpu = _timed(lambda m=msg: contestants.ask(worker, m, timeout_s), worker)
            prints = rep.get("fingerprints")
            if not isinstance(prints, list) or len(prints) != calls:
                return None, [f"timer-escape: {calls} back-to-back calls timed by the parent's clock did not report "
                              "a fingerprint of each call's outputs"]
            pick = secrets.randbelow(calls)  # drawn now that every call of the batch has returned
            checks.append({"call": first + pick, "weights_seed": weights_seed, "fingerprint": prints[pick]})
            full.append((wall, cpu))
            step = {"cmd": "steps", "seed": seed, "calls": calls, "out_specs": specs, "weights_seed": weights_seed}
            _, wall, cpu = _timed(lambda m=step: ref.ask(m, timeout_s, "steps"), ref.start())
            steps.append((wall, cpu))
    except WorkerDied as exc:
        return None, [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
    check = judged(ref, contestants, {"cmd": "batch_check", "seed": seed, "checks": checks},
                   contestants.config.trial_timeout_s, "batch_check")
    if isinstance(check, str):
        return None, [check]
    if check["reasons"]:
        return None, check["reasons"]
    batches = clocked.Batches(calls=calls, full_wall_ms=min(f[0] for f in full), full_cpu_ms=min(f[1] for f in full),
                              steps_wall_ms=min(s[0] for s in steps), steps_cpu_ms=min(s[1] for s in steps),
                              cores=1 if cuda else _cores(worker))
    return clocked.decide(timing, batches, cuda)


def time_candidate(contestants: Contestants, worker: Worker, ref: Reference, verdict: Verdict,
                   remeasure: Callable[[], tuple[Timing | None, list[str]]]) -> None:
    """Time a verified candidate into `verdict`; `remeasure` times it again in a fresh process (below the floor)."""
    verdict.warnings += [f"tolerance: {n}" for n in sorted(ref.tolerance_notes)]
    warn_if_degenerate(verdict, ref)
    timing, reasons = measure(contestants, worker, ref)
    if reasons:
        verdict.reasons += reasons
        return
    baselines = ref.baselines()
    roofline = ref.roofline()
    if roofline and timing.median_ms < roofline.floor_ms:
        first = timing.median_ms
        again, reasons = remeasure()
        if reasons:
            verdict.reasons += [f"below-floor: re-measured in a fresh process after {first:.4g} ms "
                                f"(under the floor of {roofline.floor_ms:.4g} ms) and it failed: " + r
                                for r in reasons]
            return
        timing = again
        if again.median_ms < roofline.floor_ms:
            verdict.below_floor_confirmed = True
            verdict.warnings.append(
                f"below-floor: {again.median_ms:.4g} ms is under the roofline floor of {roofline.floor_ms:.4g} ms "
                f"({roofline.bytes_moved} bytes at {roofline.bandwidth_bytes_per_s / 1e9:.0f} GB/s), confirmed in a "
                "fresh process on fresh inputs: possible only if the kernel skips bytes that cannot change the "
                "output (e.g. masked or broadcast inputs); review before trusting it")
        elif ref.device == "cpu":
            # A CPU's copy rate, measured once on a shared host, moved from 27 to 83 GB/s on the same 2-core EPYC:
            # its floor is a hint, and the fresh process's time (the slower, honest one) is what is reported.
            verdict.warnings.append(
                f"below-floor: the first measurement ({first:.4g} ms) was under the CPU's measured floor of "
                f"{roofline.floor_ms:.4g} ms and did not hold in a fresh process; its time ({again.median_ms:.4g} ms) "
                "is reported")
        else:
            verdict.reasons.append(f"below-floor: the first measurement ({first:.4g} ms) was under the roofline floor "
                                   f"of {roofline.floor_ms:.4g} ms and did not hold in a fresh process "
                                   f"({again.median_ms:.4g} ms): a time no memory system allows, not reproduced, "
                                   "is not reported")
            return
    score(verdict, timing, baselines, roofline)
