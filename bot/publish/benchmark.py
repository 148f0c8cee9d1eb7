"""`/fusebot benchmark`'s answer: a fusebot PR's kernels re-measured as they are on its branch.

The runner (runner/results/remeasure.py) returns one TargetResult per kernel folder: the fresh verdict (every trial, eager,
torch.compile and the kernel timed, alternating rounds), the drop-in's own test, `improved` when the kernel is
verified and faster than the faster baseline and otherwise `message` saying why. Here that becomes a comment on the PR
(the PR body's table per kernel, and a verdict line with every reason) and the benchmark job's check run. Composing
is pure; `deliver_benchmark` writes one comment per job, found again by its marker, so a re-delivered result edits
it and never posts a second.
"""

from __future__ import annotations

import logging

from bot.github.platform import CheckOutput, CommentRef, Platform, marker
from bot.publish import pr
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


def kernel_section(r: TargetResult) -> str:
    if r.verdict is None:
        head = f"#### `{r.class_name or r.target}`"
        parts = [head]
    else:  # the PR body's table, without its "not proposed" line: the verdict below says what holds
        parts = [pr.target_table(r.model_copy(update={"improved": True, "message": ""}))]
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


def benchmark_comment(job: Job, result: JobResult, limit: int = pr.BODY_LIMIT) -> str:
    where = f"`{job.ref}` at `{job.sha[:12]}`" if job.ref else f"`{job.sha[:12]}`"
    lines = [marker(MARKER, job.id), f"**fusebot benchmark** of this PR's kernels as they are on {where}: "
             f"**{headline(result.targets)}**.", ""]
    for r in result.targets:
        lines += [kernel_section(r), ""]
    lines += [pr.environment_line(result.environment), "",
              "Every number was measured by fusebot's harness on the runner just now, from the files on the branch "
              "(a kernel edited there is measured as edited). Comment `/fusebot benchmark` again after a change."]
    return pr.clip("\n".join(lines), limit)


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
    return CheckOutput("completed", pr.clip(title[:255]), pr.clip(summary), conclusion(results),
                       pr.environment_line(result.environment))


def deliver_benchmark(platform: Platform, job: Job, result: JobResult, *,
                      check_run_id: int | None = None) -> CommentRef | None:
    """The comment on the PR the command came from, and the job's check run."""
    if check_run_id is not None:
        platform.update_check_run(check_run_id, benchmark_check(job, result))
    if job.pr_number is None:
        log.info("benchmark job %s has no pull request: nothing to comment on", job.id)
        return None
    ref = platform.upsert_comment(job.pr_number, MARKER, job.id, benchmark_comment(job, result))
    log.info("%s#%d: benchmark of %d kernel(s) %s", job.repo, job.pr_number, len(result.targets),
             "posted" if ref.created else "updated")
    return ref
