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

from bot.github.platform import CheckOutput, marker
from bot.logs import redact
from runner.contract import Environment, Progress, TargetResult, Verdict, benchmark_table, faster_baseline

BODY_LIMIT = 65_536  # GitHub's limit on a PR body, an issue comment and a check run's summary or text
CHECK_NAME = "fusebot"
COMMANDS = (("/fusebot rerun", "search again from this PR's base branch as it is now"),
            ("/fusebot benchmark", "re-measure the kernels as they are on this branch (your edits included)"),
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
    lines = [head, "", benchmark_table(v.baselines, v.timing, v.roofline, "**fusebot**")]
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
    if v.confirmation is not None:
        c = v.confirmation
        per_round = ", ".join(f"{x:.2f}x" for x in c.speedup_vs_faster())
        lines += [f"Timed in {c.rounds} alternating rounds (fusebot, eager, torch.compile, ...), one process: speedup "
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


def mermaid_chart(r: TargetResult) -> str:
    """A bar chart of median times (GitHub renders mermaid), or "" when there is nothing to compare."""
    v = r.verdict
    if v is None or v.timing is None or v.baselines is None:
        return ""
    bars = [(n, t) for n, t in (("eager", v.baselines.eager), ("torch.compile", v.baselines.compile),
                                ("fusebot", v.timing)) if t is not None]
    if len(bars) < 2:
        return ""
    name = (r.class_name or r.target).replace('"', "'")
    return ("```mermaid\nxychart-beta\n"
            f'    title "{name}: median ms (lower is better)"\n'
            f"    x-axis [{', '.join(repr(n).replace(chr(39), chr(34)) for n, _ in bars)}]\n"
            '    y-axis "ms"\n'
            f"    bar [{', '.join(_ms(t.median_ms) for _, t in bars)}]\n```")


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
                "torch.compile, so nothing is proposed.")
    parts = []
    for r in won:
        fb, s = faster_baseline(r.verdict.baselines) if r.verdict else None, speedup(r.verdict)
        parts.append(f"`{r.class_name or r.target}` **{_x(s)}** faster than {fb[0] if fb else 'the baseline'}")
    return f"**fusebot found faster kernels for {len(won)} of {len(results)} target(s)**: " + "; ".join(parts) + "."


def pr_title(plan: PullRequestPlan) -> str:
    won = plan.improved
    if len(won) == 1:
        r = won[0]
        return f"fusebot: {_x(speedup(r.verdict))} faster {r.class_name or r.target} (fused kernel)"
    return f"fusebot: faster fused kernels for {len(won)} modules"


def module_path(kernels_dir: str, target_folder: str) -> str:
    return ".".join([*kernels_dir.strip("/").split("/"), target_folder, "dropin"])


def adopt_section(plan: PullRequestPlan) -> str:
    lines = ["### How to adopt", "",
             "Each drop-in subclasses your module: same constructor, same `state_dict` keys, so existing checkpoints "
             "load unchanged. It builds its kernel on first use (cached), runs under `torch.compile` and CUDA graphs "
             "as one custom op, and computes gradients through your original forward.", "", "```python"]
    for r in plan.improved:
        folder = next((p.split("/")[0] for p in r.files if p.endswith("/dropin.py")), None)
        if folder is None:
            continue
        if r.file:
            lines.append(f"# from {r.file.removesuffix('.py').replace('/', '.')} import {r.class_name}")
        lines.append(f"from {module_path(plan.kernels_dir, folder)} import {r.class_name or r.target}")
    lines += ["```", "", f"Check it on your machine: `python -m pytest -q {plan.kernels_dir}`. Each target's "
              f"`BENCHMARK.md` holds the numbers above with their provenance."]
    return "\n".join(lines)


def _files_section(plan: PullRequestPlan) -> str:
    paths = sorted({f"{plan.kernels_dir}/{p}" for r in plan.improved for p in r.files})
    return "<details><summary>Files</summary>\n\n" + "\n".join(f"- `{p}`" for p in paths) + "\n\n</details>"


def _commands_section() -> str:
    return "### Commands\n\n" + "\n".join(f"- `{c}`: {what}" for c, what in COMMANDS)


def _trace_block(r: TargetResult, text: str, cut: int) -> str:
    note = f"\n\n*…trace truncated ({cut} characters left out); `/fusebot explain` posts it whole.*" if cut else ""
    return (f"<details><summary>Search trace: {r.class_name or r.target}</summary>\n\n{text}{note}\n\n</details>")


def fit_traces(fixed: str, results: list[TargetResult], limit: int = BODY_LIMIT) -> list[str]:
    """Trace blocks that fit beside `fixed` within `limit`: each trace gets an equal share, cut at a line end."""
    blocks = [_trace_block(r, r.trace_markdown, 0) for r in results if r.trace_markdown]
    if len(fixed) + sum(len(b) + 2 for b in blocks) <= limit:
        return blocks
    with_trace = [r for r in results if r.trace_markdown]
    overhead = sum(len(_trace_block(r, "", 10 ** 9)) + 2 for r in with_trace)
    share = max(0, (limit - len(fixed) - overhead) // max(1, len(with_trace)))
    out = []
    for r in with_trace:
        text = r.trace_markdown
        if len(text) > share:
            cut_at = text.rfind("\n", 0, share)
            kept = text[: cut_at if cut_at > 0 else share]
            out.append(_trace_block(r, kept, len(text) - len(kept)))
        else:
            out.append(_trace_block(r, text, 0))
    return out


def pr_body(plan: PullRequestPlan, limit: int = BODY_LIMIT) -> str:
    """The PR body: verdict, tables, environment, adoption, files, commands, then the traces as space allows."""
    source = f" for #{plan.source_pr}" if plan.source_pr else ""
    parts = [marker("pr", plan.key) + (marker("job", plan.job_id) if plan.job_id else ""), verdict_line(plan.results), "",
             f"Searched `{plan.repo}` at `{plan.commit[:12]}`{source} ({plan.trigger}); base `{plan.base}`.", "",
             "### Benchmarks", ""]
    for r in plan.results:
        parts += [target_table(r), ""]
        chart = mermaid_chart(r) if r.improved else ""
        if chart:
            parts += [chart, ""]
    parts += [environment_line(plan.environment), "", adopt_section(plan), "", _files_section(plan), "",
              _commands_section(), ""]
    fixed = "\n".join(parts)
    if len(fixed) > limit:  # many targets: charts go before anything else; tables stay
        fixed = re.sub(r"```mermaid\n.*?```\n\n", "", fixed, flags=re.S)
    if len(fixed) > limit:
        raise ValueError(f"the tables alone take {len(fixed)} characters, over the {limit} limit: split the group")
    traces = fit_traces(fixed, plan.results, limit)
    body = fixed + ("\n## Search\n\n" + "\n\n".join(traces) + "\n" if traces else "")
    if len(body) > limit:  # the section heading tipped it over: drop traces
        body = fixed
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
        summary = (f"{verdict_line(plan.results)}\n\n{why}\n\nNo pull request is opened: a kernel is proposed only "
                   "when it is verified and faster than both PyTorch eager and torch.compile.")
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


def fork_comment(plan: PullRequestPlan, patch: str, limit: int = BODY_LIMIT) -> str:
    """Results for a PR from a fork: fusebot never pushes to a fork, so the patch comes as a comment."""
    head = [marker("fork", f"pr-{plan.source_pr or 0}"), verdict_line(plan.results), "",
            "This pull request comes from a fork, so fusebot does not push to it. Apply the kernels yourself:", "",
            "```sh\n# save the patch below as fusebot.patch, then\ngit apply fusebot.patch\n```", ""]
    head += [target_table(r) + "\n" for r in plan.results] + [environment_line(plan.environment), ""]
    fixed = scrub("\n".join(head))
    room = limit - len(fixed) - 200
    if room <= 0:
        return clip(fixed, limit)
    patch = scrub(patch, keep_paths=True)
    shown = patch if len(patch) <= room else patch[:room]
    note = "" if shown is patch else f"\n*…patch cut at {room} of {len(patch)} characters: see the check run.*\n"
    return clip(fixed + f"<details><summary>fusebot.patch</summary>\n\n```diff\n{shown}\n```\n{note}\n</details>\n",
                limit, keep_paths=True)


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
