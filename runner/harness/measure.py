"""Timing a verified candidate: its process times it with the shared timer, the parent cross-checks that time with
its own clock, and a time under the roofline's floor is measured again in a fresh process."""

from __future__ import annotations

import math
import os
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from runner.contract import Baselines, Roofline, Timing, Verdict
from runner.harness.checks import degenerate_reason
from runner.harness.contestants import Contestants, died_label, tail
from runner.harness.procs.process import Child, ChildDied
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


def measure(contestants: Contestants, child: Child, ref: Reference) -> tuple[Timing | None, list[str]]:
    """The candidate's time on the problem's first shape. Every timed call had fresh inputs; the judge checks a
    sample of the outputs of timed calls chosen after the last one; the parent's own clock cross-checks the time."""
    config = contestants.config
    seed = contestants.seeds.seed(f"time{contestants.seeds.counter}")
    try:
        specs, structure = ref.out_specs[0]  # timing runs on the first shape, whatever the last trial was
        rep = contestants.ask(child, {"cmd": "time", "seed": seed, "out_specs": specs, "structure": structure},
                              config.time_timeout_s)
    except ChildDied as exc:
        return None, [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
    if not rep.get("ok"):
        return None, [contestants.fault("timing", rep)]
    if rep.get("reasons"):
        return None, rep["reasons"]
    timing = Timing(**rep["timing"])
    if rep.get("samples") is not None:
        check = judged(ref, contestants, {"cmd": "timed_check", "seed": seed, "samples": rep["samples"],
                                          "dir": str(child.workdir)}, config.trial_timeout_s, "timed_check")
        for s in rep["samples"]:
            for o in s.get("outputs") or []:
                if isinstance(o, dict) and o.get("file") and Path(o["file"]).resolve().is_relative_to(
                        Path(child.workdir).resolve()):
                    Path(o["file"]).unlink(missing_ok=True)
        if isinstance(check, str):
            return None, [check]
        if check["reasons"]:
            return None, check["reasons"]
    return cross_check(contestants, child, timing)


# On the CPU an escape is a timer seeing under a tenth of the calls' cost: on the 2-core development host under load
# (load average 11-14) honest multi-threaded kernels measured 2-4x their timed time by both the wall clock and CPU time
# (preemption, and thread pools spinning at their barriers while a sibling was preempted); escapes seen were 18-181x.
CPU_ESCAPE_RATIO = 0.1


def _cpu_seconds(child: Child) -> float:
    """CPU time (user + system) of the child's process tree so far, by the kernel's accounting."""
    try:
        top = psutil.Process(child.proc.pid)
        return sum(sum(q.cpu_times()[:2]) for q in [top, *top.children(recursive=True)])
    except psutil.Error:
        return 0.0


def _cores(child: Child) -> int:
    """How many cores the child may run on (its affinity: the pinned set where the harness pins one)."""
    try:
        return max(1, len(psutil.Process(child.proc.pid).cpu_affinity()))
    except (psutil.Error, AttributeError):
        return max(1, len(os.sched_getaffinity(0)))


def _batch_ms(contestants: Contestants, child: Child, calls: int, hooks_only: bool) -> tuple[float, float]:
    """(wall ms, CPU ms of the child's processes) for `calls` calls (or their `before` steps alone), each the
    least of three runs."""
    walls, cpus = [], []
    for _ in range(3):
        c0, t0 = _cpu_seconds(child), time.perf_counter()
        contestants.ask(child, {"cmd": "wall", "calls": calls, "hooks_only": hooks_only},
                        contestants.config.time_timeout_s)
        walls.append((time.perf_counter() - t0) * 1e3)
        cpus.append((_cpu_seconds(child) - c0) * 1e3)
    return min(walls), min(cpus)


def cross_check(contestants: Contestants, child: Child, timing: Timing) -> tuple[Timing | None, list[str]]:
    """Cross-check a time with a clock the candidate cannot touch, around back-to-back calls less the same number
    of their `before` steps alone (work left running, deferred into the next call, or hidden from a slowed clock
    shows there). On CUDA: the parent's wall clock; the call's host work is not in its GPU time, so a call bound by
    its host work is told apart by its size (over 0.2 ms). On the CPU: the lesser of the parent's wall clock and the
    kernel's CPU-time accounting of the child's processes over the cores it may use, over `cpu_check_ms` (its tick
    is 10 ms): a wall clock alone also counts the time a loaded host preempted the child, and CPU time alone the
    spinning of idle thread pools, and honest kernels were rejected by each; work deferred into the next call shows
    on both. An escape on the CPU is a timer seeing under CPU_ESCAPE_RATIO of the calls' cost. (Work handed to a
    thread that outlives the call is the guards' to catch.)"""
    cuda = contestants.device == "cuda"
    span_ms = contestants.config.wall_check_ms if cuda else contestants.config.cpu_check_ms
    calls = max(3, min(1000 if cuda else 20000, math.ceil(span_ms / max(timing.median_ms, 1e-3))))
    try:
        full, hooks = _batch_ms(contestants, child, calls, False), _batch_ms(contestants, child, calls, True)
    except ChildDied as exc:
        return None, [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
    ratio = 0.5
    if cuda:
        per_call, least, clock = (full[0] - hooks[0]) / calls, 0.2, "the parent's clock"
    else:
        cores = _cores(child)
        per_call = min((full[0] - hooks[0]) / calls, (full[1] - hooks[1]) / calls / cores)
        least = 0.02
        ratio = CPU_ESCAPE_RATIO
        clock = (f"both the parent's clock and the CPU time the kernel accounted to the candidate's processes over "
                 f"{cores} core(s)")
    # On CUDA a call whose host work outlasts its kernels runs back to back at its host time: the host time the timer
    # measured beside the GPU time (Timing.host_ms, reported with every figure) accounts for that much.
    seen = max(timing.median_ms, timing.host_ms or 0.0) if cuda else timing.median_ms
    if per_call > least and seen < ratio * per_call:
        host = f" (its host work: {timing.host_ms:.4g} ms a call)" if timing.host_ms is not None else ""
        return None, [f"timer-escape: the timer saw {timing.median_ms:.4g} ms per call, but {calls} back-to-back "
                      f"calls took at best {per_call:.4g} ms each by {clock}{host}: work escaped the timed region, "
                      "or the call is bound by its host work"]
    return timing, []


def time_candidate(contestants: Contestants, child: Child, ref: Reference, verdict: Verdict,
                   remeasure: Callable[[], tuple[Timing | None, list[str]]]) -> None:
    """Time a verified candidate into `verdict`; `remeasure` times it again in a fresh process (below the floor)."""
    verdict.warnings += [f"tolerance: {n}" for n in sorted(ref.tolerance_notes)]
    warn_if_degenerate(verdict, ref)
    timing, reasons = measure(contestants, child, ref)
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
