"""Timing a verified candidate: its process times it with the shared timer, the parent cross-checks that time with
its own clock, and a time under the roofline's floor is measured again in a fresh process."""

from __future__ import annotations

import math
import time
from collections.abc import Callable

from runner.contract import Baselines, Roofline, Timing, Verdict
from runner.harness.checks import degenerate_reason
from runner.harness.contestants import Contestants, died_label, tail
from runner.harness.procs.process import Worker, WorkerDied
from runner.harness.reference import Reference


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
    """The candidate's time on the problem's first shape, cross-checked with the parent's clock (CUDA)."""
    config = contestants.config
    try:
        specs, structure = ref.out_specs[0]  # timing runs on the first shape, whatever the last trial was
        rep = contestants.ask(worker, {"cmd": "time", "seed": contestants.seeds.seed(f"time{contestants.seeds.counter}"),
                                       "out_specs": specs, "structure": structure}, config.time_timeout_s)
    except WorkerDied as exc:
        return None, [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
    if not rep.get("ok"):
        return None, [contestants.fault("timing", rep)]
    if rep.get("reasons"):
        return None, rep["reasons"]
    timing = Timing(**rep["timing"])
    if contestants.device != "cuda":
        # On the CPU both clocks measure wall time, and on a loaded machine the parent's loop absorbs preemption
        # that the in-process median filters out (correct kernels were rejected so). The CPU ways out of a timer
        # (threads still running after the call) are caught by the guards instead.
        return timing, []
    # Cross-check with a clock the candidate cannot touch: the parent's, around back-to-back calls (device work
    # left running, or deferred into the next call, shows there). The fastest of three runs.
    calls = max(3, min(1000, math.ceil(config.wall_check_ms / max(timing.median_ms, 1e-3))))
    walls = []
    for _ in range(3):
        t0 = time.perf_counter()
        try:
            contestants.ask(worker, {"cmd": "wall", "calls": calls}, config.time_timeout_s)
        except WorkerDied as exc:
            return None, [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
        walls.append((time.perf_counter() - t0) * 1e3 / calls)
    wall_ms = min(walls)
    if wall_ms > 0.2 and timing.median_ms < 0.5 * wall_ms:
        host = f" (its host work: {timing.host_ms:.4g} ms a call)" if timing.host_ms is not None else ""
        return None, [f"timer-escape: the timer saw {timing.median_ms:.4g} ms per call, but {calls} back-to-back "
                      f"calls took at best {wall_ms:.4g} ms each by the parent's clock{host}: work escaped the "
                      "timed region, or the call is bound by its host work"]
    return timing, []


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
        else:
            verdict.warnings.append(f"below-floor: the first measurement ({first:.4g} ms) was under the floor and "
                                    f"did not hold in a fresh process ({again.median_ms:.4g} ms); the latter is "
                                    "reported")
    score(verdict, timing, baselines, roofline)
