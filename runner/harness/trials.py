"""Verification: a candidate's process runs each trial of a plan, the judge compares what it wrote with the
reference's outputs for the same inputs, and the first failed trial ends it."""

from __future__ import annotations

import logging

from runner.contract import Candidate, TrialResult
from runner.errors import MachineError
from runner.harness.checks import kernel_checks
from runner.harness.contestants import Contestants, died_label, discard_outputs, tail
from runner.harness.procs.process import Child, ChildDied
from runner.harness.reference import Reference

log = logging.getLogger(__name__)


def judged(ref: Reference, contestants: Contestants, msg: dict, timeout_s: float, stage: str) -> dict | str:
    """The judge's reply to a request made while a candidate's process is alive, or, where the judge failed (a
    candidate can kill it, or hand it outputs that break it), a crash reason for the candidate. A probe in a fresh
    process first shows that the machine itself works; the judge is restarted, and a `prepare` (which needs
    nothing the dead judge held) is asked again once, so a judge lost between two candidates costs neither."""
    for attempt in (1, 2):
        try:
            return ref.prepare(msg) if stage == "prepare" else ref.ask(msg, timeout_s, stage)
        except MachineError as exc:
            ref.close()
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            contestants.probe(f"the judge failed during {stage} while a candidate's process was alive: {first}")
            if stage != "prepare" or attempt == 2:
                return (f"crash: the judge failed during {stage} while this candidate's process was alive: "
                        f"{first[-600:]}")
    raise AssertionError("unreachable")


def verify(ref: Reference, contestants: Contestants, child: Child, candidate: Candidate,
           plan: list[dict]) -> tuple[list[TrialResult], list[str]]:
    """(each trial's result, the reasons of the first failed one: none if every trial passed)."""
    timeout_s = contestants.config.trial_timeout_s
    results: list[TrialResult] = []
    profiled: set[int] = set()
    digests = []
    for k, p in enumerate(plan):
        prep = judged(ref, contestants, p, timeout_s, "prepare")
        if isinstance(prep, str):
            results.append(TrialResult(index=k, shape_set=p["shape_set"], distribution="", passed=False,
                                       reasons=[prep]))
            return results, [prep]
        if prep.get("skipped"):
            kind = "edge" if p.get("edge") else "non-finite"
            results.append(TrialResult(index=k, shape_set=p["shape_set"], distribution=f"{kind} (skipped: "
                                       f"{prep['skipped']})", passed=True))
            log.debug("%s: edge values skipped (trial %d): %s", candidate.id, k, prep["skipped"])
            continue
        if not p.get("edge") and not p.get("nonfinite"):  # (degenerate or not: a question of its own inputs)
            digests.append((prep["digest"], prep["near_constant"], prep.get("value_span"), prep["atol_min"]))
        profile = p["shape_set"] not in profiled
        profiled.add(p["shape_set"])
        msg = {"cmd": "trial", **p, "out_specs": prep["outputs"], "structure": prep["structure"],
               "reuse": k > 0, "twice": k == 0, "profile": profile}
        label = "factory" if p["randn"] is None else "randn*{:.3g}{:+.3g}".format(*p["randn"])
        label += " with edge values" if p.get("edge") else ""
        label += " with NaN and infinities" if p.get("nonfinite") else ""
        result = TrialResult(index=k, shape_set=p["shape_set"], distribution=label, passed=False)
        results.append(result)
        try:
            rep = contestants.ask(child, msg, timeout_s)
        except ChildDied as exc:
            result.reasons.append(f"{died_label(exc)}: {exc}{tail(exc.log_tail)}")
            return results, result.reasons
        if not rep.get("ok"):
            result.reasons.append(contestants.fault(f"trial {k}", rep))
            return results, result.reasons
        result.reasons += rep.get("reasons", [])
        if "outputs" in rep:
            check = judged(ref, contestants, {"cmd": "check", "trial": p["trial"], "outputs": rep["outputs"],
                             "dir": str(child.workdir), "structure": rep["structure"],
                             "expected_structure": prep["structure"], "second_run": rep.get("second_run")},
                            timeout_s, "check")
            if isinstance(check, str):
                result.reasons.append(check)
                return results, result.reasons
            discard_outputs(child.workdir, rep)
            log.debug("%s trial %d: reference %.2f s, candidate %s, outputs by %s, check %.2f s", candidate.id, k,
                     prep.get("seconds", 0.0), rep.get("seconds"), rep.get("handoff"), check.get("seconds", 0.0))
            result.reasons += check["reasons"]
            result.notes += check.get("notes", [])
            result.max_abs_err, result.max_rel_err = check.get("max_abs_err"), check.get("max_rel_err")
            result.mismatched, result.numel = check.get("mismatched", 0), check.get("numel", 0)
        if profile:
            result.reasons += kernel_checks(candidate, rep, ref.kernels())
        if p["shape_set"] == 1 and result.reasons and not any(r.startswith("runtime") for r in result.reasons):
            result.reasons.append("second-shape: wrong on the problem's second declared shape (sizes hard-coded?)")
        result.passed = not result.reasons
        if not result.passed:
            return results, result.reasons
    ref.digests += digests  # every verification's trials: whether the problem is degenerate is the problem's
    return results, []
