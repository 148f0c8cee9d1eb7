"""Nightly hygiene, the runner's half: re-verify and re-time every kernel fusebot added that is now merged.

Each `<kernels_dir>/<target>/fusebot.json` (written with the kernel, runner/results.py) names the problem and how the
kernel is built. The kernel source (its provenance header included) goes through the harness again, against the
module as it is now, on this machine's torch and device. A kernel is stale when the harness rejects it (the module
changed under it, or a trial now fails) or when it no longer beats the faster of eager and torch.compile.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from runner.contract import REMOVED_FILE, Candidate, ProblemSpec, TargetResult, Verdict
from runner.results import MANIFEST_FILE

log = logging.getLogger(__name__)


def stale_reason(v: Verdict) -> str | None:
    """Why a merged kernel should go, or None when it still earns its place. Pure."""
    if not v.accepted:
        return "no longer correct: " + "; ".join(v.reasons[:3] or [f"rejected at {v.stage}"])
    times = [t.median_ms for t in (v.baselines.eager, v.baselines.compile) if t] if v.baselines else []
    if v.timing is None or not times:
        return None
    base = min(times)
    if v.timing.median_ms >= base:
        return (f"no longer faster: {v.timing.median_ms:.4g} ms against {base:.4g} ms for the faster of eager and "
                "torch.compile")
    return None


def merged_kernels(root: Path, kernels_dir: str) -> list[tuple[str, dict]]:
    """(folder, manifest) of every fusebot kernel under root/kernels_dir."""
    out = []
    for f in sorted((root / kernels_dir).glob(f"*/{MANIFEST_FILE}")):
        try:
            out.append((f.parent.name, json.loads(f.read_text())))
        except (OSError, ValueError) as e:
            log.warning("%s: unreadable manifest (%s); skipped", f, e)
    return out


def shim_source(spec: ProblemSpec) -> str:
    """What replaces a removed drop-in: the original class under the drop-in's name, so imports keep working."""
    return (f'"""{spec.class_name} ({spec.name}): the fusebot kernel was removed (see the PR that removed it); this is the '
            f'original module again."""\n\nfrom {spec.module} import {spec.class_name}  # noqa: F401\n')


def removal(root: Path, kernels_dir: str, folder: str, spec: ProblemSpec) -> dict[str, str]:
    """Every file of the folder removed, except the drop-in (replaced by a shim) and the package markers."""
    out = {}
    for p in sorted((root / kernels_dir / folder).rglob("*")):
        if not p.is_file() or "__pycache__" in p.parts:
            continue
        rel = p.relative_to(root / kernels_dir).as_posix()
        if p.name == "dropin.py" and spec.module:
            out[rel] = shim_source(spec)
        elif p.name != "__init__.py":
            out[rel] = REMOVED_FILE
    return out


def reverify(root: Path, kernels_dir: str, backend: str | None = None) -> list[TargetResult]:
    """One TargetResult per merged kernel: `improved` true when it still holds, else the reason in `message`; the
    fresh verdict either way. `files` lists the folder's paths (relative to the kernels dir) for a removal."""
    from runner.evaluate import Evaluator, default_backend

    results = []
    for folder, m in merged_kernels(root, kernels_dir):
        spec = ProblemSpec(**m["problem"], root=str(root))
        kernel = (root / kernels_dir / folder / m["kernel"]).read_text()
        cand = Candidate(id=f"merged-{folder}", format="fast", backend=m["backend"], sources={m["kernel"]: kernel},
                         extra_cflags=m.get("extra_cflags", []))
        with Evaluator(spec, backend=backend or m["backend"] or default_backend()) as ev:
            verdict = ev.evaluate(cand)
        reason = stale_reason(verdict)
        files = removal(root, kernels_dir, folder, spec) if reason else {}
        results.append(TargetResult(target=spec.name, improved=reason is None, verdict=verdict,
                                    message=reason or "still correct and faster", class_name=spec.class_name,
                                    files=files))
    return results
