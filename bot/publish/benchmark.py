"""`/fusebot benchmark`'s answer: a fusebot PR's kernels re-measured as they are on its branch.

The runner (runner/results/remeasure.py) returns one TargetResult per kernel folder: the fresh verdict (every trial
verified by the harness; the figures those of the folder's bench script, `bench_<folder>.py`, run exactly as the PR
says to run it: alternating rounds against eager and torch.compile), the drop-in's own test, `improved` when the
kernel is verified and faster than the faster baseline by the minimum effect and otherwise `message` saying why. Here
that becomes a comment on the PR (the PR body's table per kernel, the PR's own figures from the branch's fusebot.json
beside the script's, and a verdict line with every reason) and the benchmark job's check run. Composing is pure;
`deliver_benchmark` reads the manifests and writes one comment per job, found again by its marker, so a re-delivered
result edits it and never posts a second.
"""

from __future__ import annotations

import json
import logging

from bot.github.platform import CheckOutput, CommentRef, Platform, PlatformError, marker
from bot.publish.text import BODY_LIMIT, clip
from bot.publish.verdicts import environment_line, target_table
from runner.contract import Job, JobResult, TargetResult

log = logging.getLogger(__name__)

MARKER = "benchmark"
MAX_REASONS = 8
REASON_CHARS = 400


def state(r: TargetResult) -> str:
    """faster (verified and faster), slower (verified, not faster), unverified, or unmeasured."""
    if r.verdict is None:
        return "unmeasured"
    if not r.verdict.accepted or (r.dropin_check is not None and not r.dropin_check.passed):
        return "unverified"
    return "faster" if r.improved else "slower"


def _cut(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= REASON_CHARS else text[: REASON_CHARS - 1] + "…"


def verdict_lines(r: TargetResult) -> list[str]:
    s = state(r)
    if s == "faster":
        return [f"**Verified and faster**: {r.message.removeprefix('verified; ')}."]
    if s == "slower":
        return [f"**Verified**, {r.message.removeprefix('verified, ')}."]
    if s == "unmeasured":
        return [f"**Not measured**: {r.message}"]
    reasons = list(r.verdict.reasons) if r.verdict else []
    if r.dropin_check is not None and not r.dropin_check.passed:
        reasons += [f"drop-in test: {x}" for x in r.dropin_check.reasons]
    shown = [f"- {_cut(x)}" for x in reasons[:MAX_REASONS]] or [f"- rejected at {r.verdict.stage if r.verdict else '?'}"]
    more = [f"- …and {len(reasons) - MAX_REASONS} more"] if len(reasons) > MAX_REASONS else []
    return ["**Not verified** as it is on this branch:", "", *shown, *more]


CONTESTANTS = ("PyTorch eager", "torch.compile", "fusebot", "PyTorch rewrite")


def _figures(timings: dict) -> str:
    shown = [f"{n} {timings[n]['median_ms']:.4g} ms" for n in CONTESTANTS if n in timings]
    base = [timings[n]["median_ms"] for n in CONTESTANTS[:2] if n in timings]
    mine = next((timings[n]["median_ms"] for n in CONTESTANTS[2:] if n in timings), None)
    gain = f": {min(base) / mine:.2f}x over the faster baseline" if base and mine else ""
    return ", ".join(shown) + gain


def beside_line(r: TargetResult, manifest: dict | None) -> str:
    """The PR's figures (its fusebot.json on the branch) beside the bench script's, run just now."""
    v = r.verdict
    now = {}
    if v is not None and v.timing is not None and v.baselines is not None:
        now = {n: {"median_ms": t.median_ms} for n, t in (("PyTorch eager", v.baselines.eager),
                                                        ("torch.compile", v.baselines.compile),
                                                        ("fusebot", v.timing)) if t is not None}
    claimed = (manifest or {}).get("timings") or {}
    parts = []
    if claimed:
        parts.append(f"The PR's figures: {_figures(claimed)}.")
    if now:
        parts.append(f"Now, by its bench script: {_figures(now)}.")
    return " ".join(parts)


def kernel_section(r: TargetResult, manifest: dict | None = None) -> str:
    if r.verdict is None:
        head = f"#### `{r.class_name or r.target}`"
        parts = [head]
    else:  # the PR body's table, without its "not proposed" line: the verdict below says what holds
        parts = [target_table(r.model_copy(update={"improved": True, "message": ""}))]
    beside = beside_line(r, manifest)
    if beside:
        parts += ["", beside]
    if r.kernel:
        parts += ["", f"Kernel measured: `{r.kernel}`."]
    return "\n".join([*parts, "", *verdict_lines(r)])


def headline(results: list[TargetResult]) -> str:
    counts = {s: sum(1 for r in results if state(r) == s) for s in ("faster", "slower", "unverified", "unmeasured")}
    parts = [f"{counts['faster']} of {len(results)} kernel(s) verified and faster than the faster of PyTorch eager and "
             "torch.compile"]
    parts += [f"{n} {label}" for label, n in (("verified but not faster", counts["slower"]),
                                              ("not verified", counts["unverified"]),
                                              ("not measured", counts["unmeasured"])) if n]
    return "; ".join(parts)


def benchmark_comment(job: Job, result: JobResult, limit: int = BODY_LIMIT,
                      manifests: dict[str, dict] | None = None) -> str:
    """`manifests`: each kernel folder's fusebot.json on the branch, by the TargetResult's `kernel` path."""
    where = f"`{job.ref}` at `{job.sha[:12]}`" if job.ref else f"`{job.sha[:12]}`"
    lines = [marker(MARKER, job.id), f"**fusebot benchmark** of this PR's kernels as they are on {where}: "
             f"**{headline(result.targets)}**.", ""]
    for r in result.targets:
        lines += [kernel_section(r, (manifests or {}).get(r.kernel or "")), ""]
    lines += [environment_line(result.environment), "",
              "Correctness was verified again by fusebot's harness on the runner just now, from the files on the branch "
              "(a kernel edited there is measured as edited); the times are those of each folder's bench script "
              "(`python <folder>/bench_<folder>.py`, the command the PR gives), run there. Comment "
              "`/fusebot benchmark` again after a change."]
    return clip("\n".join(lines), limit)


def branch_manifests(platform: Platform, sha: str, results: list[TargetResult]) -> dict[str, dict]:
    """Each measured folder's fusebot.json as the branch holds it (the PR's own figures), by `kernel` path."""
    out = {}
    for r in results:
        if not r.kernel or "/" not in r.kernel:
            continue
        try:
            text = platform.read_file(sha, r.kernel.rsplit("/", 1)[0] + "/fusebot.json")
            data = json.loads(text) if text else None
        except (PlatformError, ValueError):
            data = None
        if isinstance(data, dict):
            out[r.kernel] = data
    return out


def conclusion(results: list[TargetResult]) -> str:
    states = {state(r) for r in results}
    if states & {"unverified", "unmeasured"}:
        return "failure"
    return "neutral" if "slower" in states or not results else "success"


def benchmark_check(job: Job, result: JobResult) -> CheckOutput:
    results = result.targets
    bad = [r.class_name or r.target for r in results if state(r) in ("unverified", "unmeasured")]
    title = f"Not verified: {', '.join(bad)}" if bad else headline(results)
    tables = "\n\n".join(kernel_section(r) for r in results)
    summary = f"Re-measured at `{job.sha[:12]}`: {headline(results)}.\n\n{tables}"
    return CheckOutput("completed", clip(title[:255]), clip(summary), conclusion(results),
                       environment_line(result.environment))


def deliver_benchmark(platform: Platform, job: Job, result: JobResult, *,
                      check_run_id: int | None = None) -> CommentRef | None:
    """The comment on the PR the command came from, and the job's check run."""
    if check_run_id is not None:
        platform.update_check_run(check_run_id, benchmark_check(job, result))
    if job.pr_number is None:
        log.info("benchmark job %s has no pull request: nothing to comment on", job.id)
        return None
    manifests = branch_manifests(platform, job.sha, result.targets)
    ref = platform.upsert_comment(job.pr_number, MARKER, job.id, benchmark_comment(job, result, manifests=manifests))
    log.info("%s#%d: benchmark of %d kernel(s) %s", job.repo, job.pr_number, len(result.targets),
             "posted" if ref.created else "updated")
    return ref
