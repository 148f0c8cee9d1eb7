"""What a fusebot pull request, check run and comment say: pure functions of Verdicts and TargetResults.

Every number comes from a Verdict the harness produced; numbers are formatted here for display only. Bodies carry
a hidden marker (`<!-- fusebot:pr key=... -->`, bot/github/platform.py) by which the bot finds its own PRs and
comments again and updates them in place. Bodies fit GitHub's 65536-character limit: the search trace is truncated,
the tables never are. Every text that leaves here passes `clip`: cut to the limit, and scrubbed of anything that looks
like a credential and of absolute paths (a runner's temporary directories are no business of the repository's).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from bot.github.patch import split_patch
from bot.github.platform import CheckOutput, marker
from bot.logs import redact
from bot.publish import review
from runner.contract import Environment, Progress, TargetResult, Verdict, benchmark_table, faster_baseline

BODY_LIMIT = 65_536  # GitHub's limit on a PR body, an issue comment and a check run's summary or text
CHECK_NAME = "fusebot"
COMMANDS = (("/fusebot rerun", "search again from this PR's base branch as it is now"),
            ("/fusebot benchmark", "run each change's bench script on this branch, your edits included"),
            ("/fusebot explain", "post the full search trace"))
# An absolute path of two or more parts that is not part of a URL, a relative path or /dev/null.
_ABSOLUTE_PATH = re.compile(r"(?<![\w/.~:<>=-])/(?!dev/null\b)(?:[\w.@+-]+/)+([\w.@+-]*)")
CUT_NOTE = "\n\n*…cut to fit GitHub's limit.*"


# ---- what may be published ----------------------------------------------------------------------------------------

def scrub(text: str, *, keep_paths: bool = False) -> str:
    """`text` without credentials (GitHub and API tokens, keys, PEM blocks, Authorization headers) and without
    absolute paths (each becomes `…/<its last part>`): verdict reasons, build logs and traces come from a machine
    that ran untrusted code, and what it printed may hold either. `keep_paths`: a patch, which must still apply, keeps
    its text but for credentials."""
    text = redact(text)
    return text if keep_paths else _ABSOLUTE_PATH.sub(lambda m: "…/" + m.group(1), text)


def clip(text: str, limit: int = BODY_LIMIT, *, keep_paths: bool = False) -> str:
    """What may be published: `scrub`bed, then cut to `limit` characters with a note saying so."""
    text = scrub(text, keep_paths=keep_paths)
    return text if len(text) <= limit else text[: limit - len(CUT_NOTE)] + CUT_NOTE


# ---- names -------------------------------------------------------------------------------------------------------

def _slug(text: str) -> str:
    return re.sub(r"[^0-9A-Za-z._-]+", "-", text).strip("-.").lower() or "all"


def branch_name(base: str, group: str) -> str:
    """One branch per base branch and target group: `fusebot/<base>/<group>`."""
    return f"fusebot/{base.strip('/')}/{_slug(group)}"


def pr_key(base: str, group: str) -> str:
    return f"{base.strip('/')}/{_slug(group)}"


# ---- numbers for display ---------------------------------------------------------------------------------------

def _ms(x: float) -> str:
    return f"{x:.4g}"


def _x(ratio: float | None) -> str:
    return f"{ratio:.2f}x" if ratio is not None else "n/a"


def speedup(v: Verdict | None) -> float | None:
    """Speedup of the verdict's kernel over the faster baseline, or None when either time is missing."""
    fb = faster_baseline(v.baselines) if v else None
    if v is None or v.timing is None or fb is None or v.timing.median_ms <= 0:
        return None
    return fb[1].median_ms / v.timing.median_ms


def target_table(r: TargetResult) -> str:
    """The benchmark table of one target (never truncated) and its correctness line."""
    v = r.verdict
    head = f"#### `{r.class_name or r.target}`" + (f" in `{r.file}`" if r.file else "")
    if v is None:
        return f"{head}\n\n{r.message or 'no verified kernel'}"
    label = f"**{review.REWRITE_LABEL}**" if review.is_rewrite(r) else "**fusebot**"
    lines = [head, "", review.with_rewrite_row(benchmark_table(v.baselines, v.timing, v.roofline, label), r)]
    passed = sum(1 for t in v.trials if t.passed)
    abs_errs = [t.max_abs_err for t in v.trials if t.max_abs_err is not None]
    rel_errs = [t.max_rel_err for t in v.trials if t.max_rel_err is not None]
    shapes = len({t.shape_set for t in v.trials})
    lines += ["", f"Verified: {passed}/{len(v.trials)} trials passed over {shapes} shape set(s); max abs error "
                  f"{max(abs_errs):.3g}, max rel error {max(rel_errs):.3g}." if abs_errs and rel_errs else
              f"Verified: {passed}/{len(v.trials)} trials passed."]
    if v.roofline:
        lines[-1] += (f" Roofline floor {_ms(v.roofline.floor_ms)} ms ({v.roofline.bytes_moved} bytes at "
                      f"{v.roofline.bandwidth_bytes_per_s / 1e9:.0f} GB/s).")
    if r.dropin_check is not None:
        c = r.dropin_check
        lines[-1] += f" Drop-in test run by the runner: {c.passed_tests} passed, {c.failed_tests} failed."
    if (c := v.confirmation) is not None:
        per_round = ", ".join(f"{x:.2f}x" for x in c.speedup_vs_faster())
        where = "one process" if c.processes == 1 else f"{c.processes} processes one after the other"
        lines += [f"Timed in {c.rounds} alternating rounds (fusebot, eager, torch.compile, ...), {where}: speedup "
                  f"over the faster baseline per round {per_round}."]
    lines += [f"> {w}" for w in v.warnings]
    if not r.improved and r.message:
        lines += ["", f"Not proposed: {r.message}"]
    return "\n".join(lines)


def environment_line(env: Environment | None) -> str:
    if env is None:
        return "Environment: not reported."
    device = env.gpu or env.cpu or env.device
    return (f"Measured on **{device}**; driver {env.driver or 'n/a'}, CUDA {env.cuda or 'n/a'}, torch {env.torch}, "
            f"Python {env.python}, fusebot {env.fusebot}. Times are medians of n calls (cache flushed before each); "
            "spread is the interquartile range.")


# ---- the pull request --------------------------------------------------------------------------------------------

@dataclass
class PullRequestPlan:
    """Everything a fusebot PR says. `source_pr` is the labelled PR it answers (None: nightly or demo)."""

    repo: str
    base: str
    group: str
    commit: str
    results: list[TargetResult]
    environment: Environment | None = None
    kernels_dir: str = "fusebot_kernels"
    source_pr: int | None = None
    trigger: str = "label"
    job_id: str | None = None  # the job whose results these are (`/fusebot explain` and `rerun` find it by marker)
    extra: dict[str, str] = field(default_factory=dict)

    @property
    def branch(self) -> str:
        return branch_name(self.base, self.group)

    @property
    def key(self) -> str:
        return pr_key(self.base, self.group)

    @property
    def improved(self) -> list[TargetResult]:
        return [r for r in self.results if r.improved]


def verdict_line(results: list[TargetResult]) -> str:
    won = [r for r in results if r.improved]
    if not won:
        return (f"**No faster kernel** for {len(results)} target(s): nothing beat the faster of PyTorch eager and "
                "torch.compile by the minimum effect, so nothing is proposed.")
    parts = []
    for r in won:
        fb, s = faster_baseline(r.verdict.baselines) if r.verdict else None, speedup(r.verdict)
        what = "a PyTorch rewrite of" if review.is_rewrite(r) else "a fused kernel for"
        parts.append(f"{what} `{r.class_name or r.target}`, **{_x(s)}** faster than {fb[0] if fb else 'the baseline'}")
    devices = sorted({review.device_text(r.verdict.environment) for r in won if r.verdict and r.verdict.environment})
    where = f" on {', '.join(devices)}" if devices else ""
    declined = len(results) - len(won)
    rest = f"; {declined} of {len(results)} target(s) declined" if declined else ""
    return "**Proposed**: " + "; ".join(parts) + f"{where}{rest}."


def _device(plan: PullRequestPlan) -> str:
    envs = [r.verdict.environment for r in plan.improved if r.verdict and r.verdict.environment]
    return review.device_text(envs[0] if envs else plan.environment)


def pr_title(plan: PullRequestPlan) -> str:
    """Module, speedup and GPU (or "CPU <model>")."""
    won = plan.improved
    if len(won) == 1:
        r = won[0]
        fb = faster_baseline(r.verdict.baselines) if r.verdict else None
        what = "PyTorch rewrite" if review.is_rewrite(r) else "fused kernel"
        return (f"fusebot: {r.class_name or r.target} {_x(speedup(r.verdict))} faster than "
                f"{fb[0] if fb else 'baseline'} ({what}, {_device(plan)})")
    best = max((s for s in (speedup(r.verdict) for r in won) if s is not None), default=None)
    return f"fusebot: {len(won)} modules faster, up to {_x(best)} ({_device(plan)})"


def module_path(kernels_dir: str, target_folder: str) -> str:
    return ".".join([*kernels_dir.strip("/").split("/"), target_folder, "dropin"])


def _folder(r: TargetResult) -> str | None:
    return next((p.split("/")[0] for p in sorted(r.files) if p.endswith("/fusebot.json")), None)


def adopt_lines(plan: PullRequestPlan, r: TargetResult) -> list[str]:
    """How to use one proposed change."""
    folder = _folder(r)
    if review.is_rewrite(r):
        return [f"Adopt: merge; `{r.file}` itself changes (the diff above), nothing else to import."]
    if folder is None:
        return []
    cls = r.class_name or r.target
    was = f"`from {r.file.removesuffix('.py').replace('/', '.')} import {cls}`" if r.file else "your class"
    return [f"Adopt: `from {module_path(plan.kernels_dir, folder)} import {cls}` in place of {was} (a subclass: "
            "same constructor, same `state_dict` keys, so existing checkpoints load)."]


def _files_section(plan: PullRequestPlan) -> str:
    paths = sorted({p[1:] if p.startswith("/") else f"{plan.kernels_dir}/{p}" for r in plan.improved for p in r.files})
    return "<details><summary>Files</summary>\n\n" + "\n".join(f"- `{p}`" for p in paths) + "\n\n</details>"


def _commands_section() -> str:
    return "Commands: " + " · ".join(f"`{c}` ({what})" for c, what in COMMANDS) + "."


def _details_block(r: TargetResult, env_line: str) -> str:
    table = target_table(r.model_copy(update={"message": ""}))
    choice = review.manifest_of(r).get("choice")
    if choice:
        table += f"\n\nWhy this change: {choice}."
    return (f"<details><summary>Benchmark details: {r.class_name or r.target}</summary>\n\n{table}\n\n{env_line}"
            "\n\n</details>\n")


def _trace_block(r: TargetResult, text: str, cut: int) -> str:
    note = f"\n\n*…trace truncated ({cut} characters left out); `/fusebot explain` posts it whole.*" if cut else ""
    return (f"<details><summary>Search trace: {r.class_name or r.target}</summary>\n\n{text}{note}\n\n</details>")


def fit_traces(fixed: str, results: list[TargetResult], limit: int = BODY_LIMIT) -> list[str]:
    """Trace blocks (each clipped to review.TRACE_ROWS rows) that fit beside `fixed` within `limit`: each trace gets an
    equal share, cut at a line end."""
    traces = [(r, review.clip_trace(r.trace_markdown)) for r in results if r.trace_markdown]
    blocks = [_trace_block(r, t, 0) for r, t in traces]
    if len(fixed) + sum(len(b) + 2 for b in blocks) <= limit:
        return blocks
    overhead = sum(len(_trace_block(r, "", 10 ** 9)) + 2 for r, _ in traces)
    share = max(0, (limit - len(fixed) - overhead) // max(1, len(traces)))
    out = []
    for r, text in traces:
        if len(text) > share:
            cut_at = text.rfind("\n", 0, share)
            kept = text[: cut_at if cut_at > 0 else share]
            out.append(_trace_block(r, kept, len(text) - len(kept)))
        else:
            out.append(_trace_block(r, text, 0))
    return out


def pr_body(plan: PullRequestPlan, limit: int = BODY_LIMIT) -> str:
    """The PR body, in the order a reviewer needs it: verdict, one summary table, the declined targets, per proposed
    target its compatibility block, the change (a rewrite's diff) and how to adopt it; then, folded, the benchmark
    details, the files and the search traces; last, how to reproduce, roll back and decline."""
    env_line = environment_line(plan.environment)
    parts = [marker("pr", plan.key) + (marker("job", plan.job_id) if plan.job_id else ""), verdict_line(plan.results),
             "", review.summary_table(plan.results), ""]
    declined = review.declined_lines(plan.results)
    if declined:
        parts += ["**Declined**:", *declined, ""]
    folders = {}
    for r in plan.improved:
        folder = _folder(r) or r.target
        folders[r.target] = folder
        env = r.verdict.environment if r.verdict and r.verdict.environment else plan.environment
        diff = review.rewrite_diff(r)
        parts += [review.compatibility(r, env, folder, plan.kernels_dir), "", *([diff, ""] if diff else []),
                  *adopt_lines(plan, r), ""]
    source = f" for #{plan.source_pr}" if plan.source_pr else ""
    tail = ["", review.footer(plan.results, plan.kernels_dir, folders), "", _commands_section(),
            f"Searched `{plan.repo}` at `{plan.commit[:12]}`{source} ({plan.trigger}); base `{plan.base}`.", ""]
    parts += [_details_block(r, env_line) for r in plan.results if r.verdict is not None]
    parts += ["", _files_section(plan)]
    fixed = "\n".join(parts)
    tail_text = "\n".join(tail)
    if len(fixed) + len(tail_text) > limit:
        raise ValueError(f"the tables alone take {len(fixed) + len(tail_text)} characters, over the {limit} limit: "
                         "split the group")
    traces = fit_traces(fixed + tail_text + "\n\n", plan.results, limit)
    body = fixed + ("\n\n" + "\n\n".join(traces) if traces else "") + "\n" + tail_text
    if len(body) > limit:  # the joins tipped it over: drop traces
        body = fixed + "\n" + tail_text
    return clip(body, limit)


# ---- check runs ----------------------------------------------------------------------------------------------------

def check_queued(targets: list[str]) -> CheckOutput:
    return CheckOutput("queued", "Waiting for a GPU runner",
                       clip(f"{len(targets)} marked target(s) queued: " + ", ".join(f"`{t}`" for t in targets) + "."))


def check_in_progress(p: Progress, rounds: int, target: str = "") -> CheckOutput:
    best = _x(p.best_speedup) if p.best_speedup is not None else "none yet"
    what = f" `{target}`:" if target else ""
    summary = (f"Searching{what} round {p.round}/{rounds}; {p.built} candidate(s) built, {p.verified} verified, "
               f"{p.rejected} rejected; best so far {best} over the faster baseline.")
    return CheckOutput("in_progress", f"Round {p.round}/{rounds}: best {best}",
                       clip(summary + (f" {p.message}" if p.message else "")))


def check_completed(plan: PullRequestPlan, pr_url: str | None = None, error: str | None = None) -> CheckOutput:
    """success with the tables when a kernel is proposed; neutral, with why, when nothing beat the faster baseline;
    failure when the job itself failed."""
    if error:
        return CheckOutput("completed", "fusebot could not finish", clip(f"The optimization job failed: {error}"),
                           "failure")
    tables = "\n\n".join(target_table(r) for r in plan.results)
    env = environment_line(plan.environment)
    if not plan.improved:
        why = "\n".join(f"- `{r.class_name or r.target}`: {r.message or 'no verified kernel'}" for r in plan.results)
        summary = (f"{verdict_line(plan.results)}\n\n{why}\n\nNo pull request is opened: a change is proposed only "
                   "when it is verified and faster than both PyTorch eager and torch.compile, in every confirmation "
                   "round and by the minimum effect (the larger of 3% and the rounds' spread).")
        return CheckOutput("completed", "No faster kernel", clip(summary), "neutral",
                           clip(f"{tables}\n\n{env}"))
    link = f"\n\nProposed in {pr_url}." if pr_url else ""
    title = ", ".join(f"{r.class_name or r.target} {_x(speedup(r.verdict))}" for r in plan.improved)
    return CheckOutput("completed", f"Faster: {title}"[:255], clip(f"{verdict_line(plan.results)}{link}\n\n{tables}"),
                       "success", clip(env + "\n\n" + "\n\n".join(fit_traces(env, plan.results))))


# ---- comments --------------------------------------------------------------------------------------------------

def status_comment(pr_number: int, state: str, plan: PullRequestPlan | None = None, pr_url: str | None = None,
                   detail: str = "") -> str:
    """The one status comment on a labelled PR (found again by its marker and edited in place)."""
    lines = [marker("status", f"pr-{pr_number}"), f"**fusebot**: {state}"]
    if detail:
        lines.append(detail)
    if plan is not None:
        lines += ["", verdict_line(plan.results)]
        for r in plan.results:
            s = speedup(r.verdict) if r.improved else None
            lines.append(f"- `{r.class_name or r.target}`: " + (f"{_x(s)} faster" if s is not None else
                                                               (r.message or "no faster kernel")))
    if pr_url:
        lines += ["", f"Kernels, drop-ins, tests and benchmarks: {pr_url}"]
    return clip("\n".join(lines))


def fork_comments(plan: PullRequestPlan, patch: str, limit: int = BODY_LIMIT) -> list[str]:
    """Results for a PR from a fork: fusebot never pushes to a fork, so the patch comes in comments, whole files in
    each, as many comments as it takes (a drop-in alone is tens of kilobytes; a comment holds 65536 characters)."""
    patch = scrub(patch, keep_paths=True)
    table = [target_table(r) + "\n" for r in plan.results] + [environment_line(plan.environment), ""]
    table_text = scrub("\n".join(table))
    frame = 400  # a part's marker, title and fences
    parts, too_large = split_patch(patch, limit - frame, first_room=limit - frame - 1200 - len(table_text))
    n = len([p for p in parts if p]) or 1
    if n == 1:
        how = "```sh\n# save the patch below as fusebot.patch, then\ngit apply fusebot.patch\n```"
    else:
        where = f"this comment and the next {n - 1}" if parts[0] else f"the next {n} comments"
        how = (f"The patch comes in {n} parts, in {where}, whole files in each, so each part applies by itself:"
               f"\n\n```sh\n# save part k as fusebot-k.patch (k = 1..{n}), then\n"
               f"git apply fusebot-*.patch\n```")
    head = [marker("fork", f"pr-{plan.source_pr or 0}"), verdict_line(plan.results), "",
            "This pull request comes from a fork, so fusebot does not push to it. Apply the kernels yourself:", "",
            how, ""]
    for section in too_large:
        path = section.split("\n", 1)[0].removeprefix("diff --git a/").split(" b/", 1)[0]
        head.append(f"*`{path}` ({len(section)} characters of patch) is larger than a comment holds and is not in "
                    "the patch: run `fusebot optimize` on the module to get it.*\n")
    first = scrub("\n".join(head)) + table_text
    out, k = [], 0
    for i, part in enumerate(parts):
        k += bool(part)
        title = "fusebot.patch" if n == 1 else f"fusebot.patch, part {k} of {n} (fusebot-{k}.patch)"
        block = f"<details><summary>{title}</summary>\n\n```diff\n{part}```\n\n</details>\n" if part else ""
        text = first + block if i == 0 else f"{marker('fork', f'pr-{plan.source_pr or 0}-part-{k}')}\n{block}"
        out.append(clip(text, limit, keep_paths=True))
    return out


def explain_comments(job_id: str, results: list[TargetResult], limit: int = BODY_LIMIT) -> list[str]:
    """`/fusebot explain`: every target's whole search trace, in as many comments as it takes."""
    head = f"**fusebot search trace** (job `{job_id[:12]}`)\n\n"
    blocks = [f"### {r.class_name or r.target}\n\n{r.trace_markdown or 'no trace recorded'}" for r in results]
    out, current = [], head
    for block in blocks or ["no targets"]:
        while block:
            room = limit - len(current) - 2
            if len(block) <= room:
                current += block + "\n\n"
                block = ""
            else:
                cut = block.rfind("\n", 0, room)
                cut = cut if cut > 0 else room
                if cut <= 0 or room < 200:
                    out.append(current)
                    current = head
                    continue
                current += block[:cut]
                block = block[cut:]
                out.append(current)
                current = head + "*(continued)*\n\n"
    out.append(current)
    return [clip(text, limit) for text in out]
