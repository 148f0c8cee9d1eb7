"""What a result's manifest says beyond how to rebuild the kernel, and the files of a PyTorch rewrite. Pure.

The manifest (`fusebot.json`, runner/results/files.py) carries, besides the problem and the kernel:
- `change`: "kernel" or "rewrite", `choice` (why that one), `margin` (the minimum effect it cleared, a fraction);
- `verified`: backend, device, each shape set's input shapes and dtypes, the output dtypes, the tolerance, the trials
  and the largest errors (runner/results/shapes.py describes the shapes);
- `timings`: every timed contestant (eager, torch.compile, the change, the PyTorch rewrite when one was verified)
  with its median, IQR, n and every raw sample;
- for a rewrite, `diff`: the unified diff of the module's file.
The PR body (bot/publish/body.py) reads these from the manifest's text, so the bot needs no schema beyond the contract.

A rewrite's files: the module's file with its new text (keyed by its repository path with a leading "/", which
bot/publish/propose.py writes at that path, not under the kernels directory), and in the kernels directory its
BENCHMARK.md, fusebot.json and bench script.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass

from runner.contract import Timing, Verdict
from runner.results.bench_script import KERNEL_LABEL, REWRITE_LABEL, figures_json

KERNEL, REWRITE = "kernel", "rewrite"
ROOT_PREFIX = "/"  # a TargetResult.files key starting with it is a repository path, not under the kernels directory


@dataclass(frozen=True)
class Fallback:
    """The PyTorch rewrite's own claim when it cleared its margin and a kernel was chosen over it: what is proposed
    instead when the kernel then fails its generated test or its bench script (runner/results/files.py)."""

    message: str  # the rewrite's claim (runner.results.choice.claim)
    margin: float | None  # the minimum effect it cleared


def unified_diff(path: str, old: str, new: str) -> str:
    """`git apply`-able unified diff of one file (a/ and b/ prefixes)."""
    lines = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True),
                                 fromfile=f"a/{path}", tofile=f"b/{path}")
    return "".join(line if line.endswith("\n") else line + "\n\\ No newline at end of file\n" for line in lines)


def verified_section(v: Verdict, verified: dict | None, backend: str) -> dict:
    """Backend, device, shapes, dtypes, tolerance, trials and largest errors: what the PR's compatibility block
    states."""
    e = v.environment
    abs_errs = [t.max_abs_err for t in v.trials if t.max_abs_err is not None]
    rel_errs = [t.max_rel_err for t in v.trials if t.max_rel_err is not None]
    out = {"backend": backend, "device": (e.gpu or e.cpu or e.device) if e else "",
           "gpu": bool(e and e.gpu), "cuda": e.cuda if e else None, "torch": e.torch if e else "",
           "trials": len(v.trials), "trials_passed": sum(1 for t in v.trials if t.passed),
           "shape_sets": len({t.shape_set for t in v.trials}),
           "distributions": sorted({t.distribution for t in v.trials if t.distribution}),
           "max_abs_err": max(abs_errs) if abs_errs else None, "max_rel_err": max(rel_errs) if rel_errs else None}
    for name in ("oracle_abs_err", "oracle_rel_err"):  # when the verdict carries its errors against the oracle
        found = [getattr(t, name) for t in v.trials if getattr(t, name, None) is not None]
        if found:
            out[name] = max(found)
    if verified:
        out |= {"shapes": verified.get("shape_sets", []), "atol": verified.get("atol"), "rtol": verified.get("rtol")}
    return out


def timings(v: Verdict, change: str, rewrite: Timing | None = None) -> dict[str, dict]:
    b = v.baselines
    label = REWRITE_LABEL if change == REWRITE else KERNEL_LABEL
    named: dict[str, Timing | None] = {"PyTorch eager": b.eager if b else None,
                                       "torch.compile": b.compile if b else None, label: v.timing}
    if change != REWRITE and rewrite is not None:
        named[REWRITE_LABEL] = rewrite
    return figures_json(named)


def manifest_extra(v: Verdict, *, backend: str, change: str = KERNEL, choice: str = "", margin: float | None = None,
                   verified: dict | None = None, rewrite: Timing | None = None, diff: str = "") -> dict:
    out = {"change": change, "choice": choice, "margin": margin, "verified": verified_section(v, verified, backend),
           "timings": timings(v, change, rewrite)}
    if v.confirmation is not None:
        out["rounds_vs_faster"] = v.confirmation.speedup_vs_faster()
    if diff:
        out["diff"] = diff
    return out


def without_samples(data: dict) -> dict:
    """A manifest as its branch holds it: each timing's median, IQR, n and clock, not its raw samples (those stay
    in the run's result.json and its verdicts: a maintainer owns the change, its test and its bench script)."""
    timings = {name: {k: v for k, v in t.items() if k != "samples_ms"} for name, t in (data.get("timings") or {}).items()}
    return data | ({"timings": timings} if "timings" in data else {})
