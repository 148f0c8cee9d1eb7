"""Timing a verified candidate: its process times it with the shared timer, the parent bounds that time with its own
clock around back-to-back calls whose outputs it has checked (runner.harness.clocked), and a time under the
roofline's floor is measured again in a fresh process."""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import secrets
import time
from collections.abc import Callable
from pathlib import Path

import psutil

from runner.contract import Baselines, Roofline, Timing, Verdict
from runner.harness import clocked
from runner.harness.checks import degenerate_reason
from runner.harness.contestants import Contestants, died_label, tail
from runner.harness.procs.process import Child, ChildDied
from runner.harness.reference import Reference
from runner.harness.trials import judged

log = logging.getLogger(__name__)


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


def measure(contestants: Contestants, child: Child, ref: Reference,
            raise_: bool = True) -> tuple[Timing | None, list[str]]:
    """The candidate's time on the problem's first shape. Every timed call had fresh inputs; the judge checks a
    sample of the outputs of timed calls chosen after the last one; the parent's own clock cross-checks the time
    (`raise_` False: the bound is recorded, not applied: clocked.common applies one to a confirmation's rounds)."""
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
    return cross_check(contestants, child, ref, timing, seed, raise_)


_LIBC = ctypes.CDLL(None, use_errno=True)
_LIBC = _LIBC if hasattr(_LIBC, "clock_getcpuclockid") else None


def _process_cpu_seconds(pid: int) -> float:
    """CPU time of process `pid` (every thread it ran, ended ones included), to the nanosecond where the kernel
    gives its CPU clock (clock_getcpuclockid), else in its 10 ms ticks: a batch of a few hundred milliseconds of
    calls on a loaded host spends a few ticks of CPU, too few to bound a call by."""
    clock = ctypes.c_int()
    if _LIBC is not None and _LIBC.clock_getcpuclockid(pid, ctypes.byref(clock)) == 0:
        with contextlib.suppress(OSError):
            return time.clock_gettime(clock.value)
    return sum(psutil.Process(pid).cpu_times()[:2])


def _cpu_seconds(child: Child | None) -> float:
    """CPU time (user + system) of the child's process tree so far, by the kernel's accounting."""
    try:
        top = psutil.Process(child.proc.pid)
        total = 0.0
        for q in [top, *top.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                total += _process_cpu_seconds(q.pid)
        return total
    except (psutil.Error, AttributeError):
        return 0.0


def _cores(child: Child) -> int:
    """How many cores the child may run on (its affinity: the pinned set where the harness pins one)."""
    try:
        return max(1, len(psutil.Process(child.proc.pid).cpu_affinity()))
    except (psutil.Error, AttributeError):
        return max(1, len(os.sched_getaffinity(0)))


def _timed(ask, child: Child | None) -> tuple[dict, float, float]:
    """(reply, wall ms by the parent's clock, CPU ms of the child's processes) of one request."""
    c0, t0 = _cpu_seconds(child), time.perf_counter()
    reply = ask()
    return reply, (time.perf_counter() - t0) * 1e3, (_cpu_seconds(child) - c0) * 1e3


def _step_ms(ref: Reference, step: dict, budget_ms: float, timeout_s: float) -> float:
    """The judge's cost of one call's steps by the parent's clock: after one call that makes the judge's inputs for
    the cross-check, probes of 1, 4, 16... calls until one of at least PROBE_CALLS_MIN costs a quarter of the budget
    or has PROBE_CALLS_MAX (a request's own cost, tens of milliseconds on a loaded host, spread over its calls:
    taken for one call's, it cut a batch to MIN_CALLS, whose bound that cost then swamped)."""
    judge = ref.start()
    ref.ask({**step, "calls": 1}, timeout_s, "steps")
    calls = 1
    while True:
        _, wall, _ = _timed(lambda n=calls: ref.ask({**step, "calls": n}, timeout_s, "steps"), judge)
        if calls >= clocked.PROBE_CALLS_MAX or (calls >= clocked.PROBE_CALLS_MIN and wall >= budget_ms / 4):
            return wall / calls
        calls *= 4


def overhead_ms(ref: Reference) -> float:
    """(CUDA) The host work per call that a GPU time leaves out, measured on the parent's side: the reference's own,
    by the judge's timer for the eager baseline (0 where it has none). What the candidate's process says of its own
    host work is never used."""
    eager = ref.baselines().eager
    return eager.host_ms if eager is not None and eager.host_ms is not None else 0.0


def cross_check(contestants: Contestants, child: Child, ref: Reference, timing: Timing,
                seed: int, raise_: bool = True) -> tuple[Timing | None, list[str]]:
    """The time that counts (runner.harness.clocked): the parent times three batches of back-to-back calls in the
    candidate's process (each output fingerprinted), and the same steps without the calls in the judge's; then it
    draws one call of each batch, whose fingerprints the judge checks against the oracle on that call's inputs.
    On CUDA the GPU time may beat that by the reference's host work per call, as the judge measured it (`overhead_ms`).
    A batch holds what its budget of the parent's time does (clocked.batch_calls), at the judge's measured cost of
    a call's steps; an escape is measured again before it is named (clocked.measured_decision)."""
    cuda = contestants.device == "cuda"
    return clocked.measured_decision(timing, lambda: _batches(contestants, child, ref, timing, seed), cuda, raise_)


def _batches(contestants: Contestants, child: Child, ref: Reference, timing: Timing,
             seed: int) -> clocked.Batches | list[str]:
    """One measurement of the cross-check: its batches sized afresh, timed, and a drawn call of each checked; or
    the reason there is none."""
    cuda = contestants.device == "cuda"
    budget_ms = contestants.config.wall_check_ms if cuda else contestants.config.cpu_check_ms
    timeout_s = contestants.config.time_timeout_s
    specs, _ = ref.out_specs[0]
    step = {"cmd": "steps", "seed": seed, "out_specs": specs, "weights_seed": 1}
    calls = clocked.batch_calls(budget_ms, _step_ms(ref, step, budget_ms, timeout_s), timing.median_ms, cuda)
    full, steps, checks = [], [], []
    try:
        for _ in range(3):
            first, weights_seed = 1 + secrets.randbelow(1 << 40), secrets.randbelow(1 << 62)
            msg = {"cmd": "batch", "calls": calls, "first": first, "weights_seed": weights_seed}
            rep, wall, cpu = _timed(lambda m=msg: contestants.ask(child, m, timeout_s), child)
            prints = rep.get("fingerprints")
            if not isinstance(prints, list) or len(prints) != calls:
                return [f"timer-escape: {calls} back-to-back calls timed by the parent's clock did not report "
                        "a fingerprint of each call's outputs"]
            pick = secrets.randbelow(calls)  # drawn now that every call of the batch has returned
            checks.append({"call": first + pick, "weights_seed": weights_seed, "fingerprint": prints[pick]})
            full.append((wall, cpu))
            m = {**step, "calls": calls, "first": first, "weights_seed": weights_seed}
            _, wall, cpu = _timed(lambda m=m: ref.ask(m, timeout_s, "steps"), ref.start())
            steps.append((wall, cpu))
    except ChildDied as exc:
        return [f"{died_label(exc)} while timing: {exc}{tail(exc.log_tail)}"]
    check = judged(ref, contestants, {"cmd": "batch_check", "seed": seed, "checks": checks},
                   contestants.config.trial_timeout_s, "batch_check")
    if isinstance(check, str):
        return [check]
    if check["reasons"]:
        return check["reasons"]
    batches = clocked.Batches.from_runs(calls, full, steps, cores=1 if cuda else _cores(child),
                                        overhead_ms=overhead_ms(ref) if cuda else 0.0)
    log.debug("parent-clocked batches of %s: %s (walls %s, steps %s)", child.workdir.name, batches, full, steps)
    return batches


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
