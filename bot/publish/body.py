"""A fusebot pull request's title and body: pure text from the plan's TargetResults and their manifests, in the order
a reviewer needs it.

    pr_title(plan)                  module, speedup and device
    pr_body(plan)                   the verdict line; one summary table (module, before -> after, speedup over the
                                    faster baseline, spread, % of floor); one line per declined target; per proposed
                                    target its compatibility block (device and backend, shapes and dtypes verified,
                                    tolerance and accuracy, what works, run-time needs), a rewrite's diff and how to
                                    adopt it; folded, the benchmark details, the files and the search traces; last,
                                    the footer (how to reproduce, roll back and decline) and the commands

The body carries a hidden marker (`<!-- fusebot:pr key=... -->`, bot/github/platform.py) by which the bot finds its
PR again and updates it in place. It fits GitHub's limit: the search traces are cut, the tables never are. The
drop-in's behaviour stated here is its contract (runner/harness/dropin.py): it defers to the original module whenever
gradients are needed, falls back to the original forward outside the verified sizes, dtypes and devices, and
`FUSEBOT_DISABLE=1` turns it off.
"""

from __future__ import annotations

from bot.github.platform import marker
from bot.publish.plan import PullRequestPlan
from bot.publish.text import BODY_LIMIT, clip
from bot.publish.verdicts import (
    REWRITE_LABEL,
    device_text,
    environment_line,
    gain,
    is_rewrite,
    manifest_of,
    name,
    speedup,
    target_table,
    times,
    verdict_line,
)
from runner.contract import Environment, TargetResult, Verdict, faster_baseline, table_cell

COMMANDS = (("/fusebot rerun", "search again from this PR's base branch as it is now"),
            ("/fusebot benchmark", "run each change's bench script on this branch, your edits included"),
            ("/fusebot explain", "post the full search trace"))
DIFF_CHARS = 6000  # a rewrite's diff shown in the body at most; the PR's files hold it whole
YES, NO, UNKNOWN = "✅", "❌", "❔"
TRACE_ROWS = 25  # table rows of one search trace shown in the body; `/fusebot explain` posts all


def _device(plan: PullRequestPlan) -> str:
    envs = [r.verdict.environment for r in plan.improved if r.verdict and r.verdict.environment]
    return device_text(envs[0] if envs else plan.environment)


def pr_title(plan: PullRequestPlan) -> str:
    """Module, speedup and GPU (or "CPU <model>")."""
    won = plan.improved
    if len(won) == 1:
        r = won[0]
        fb = faster_baseline(r.verdict.baselines) if r.verdict else None
        what = "PyTorch rewrite" if is_rewrite(r) else "fused kernel"
        return (f"fusebot: {r.class_name or r.target} {times(speedup(r.verdict))} faster than "
                f"{fb[0] if fb else 'baseline'} ({what}, {_device(plan)})")
    best = max((s for s in (speedup(r.verdict) for r in won) if s is not None), default=None)
    return f"fusebot: {len(won)} modules faster, up to {times(best)} ({_device(plan)})"


def module_path(kernels_dir: str, target_folder: str) -> str:
    return ".".join([*kernels_dir.strip("/").split("/"), target_folder, "dropin"])


def _folder(r: TargetResult) -> str | None:
    return next((p.split("/")[0] for p in sorted(r.files) if p.endswith("/fusebot.json")), None)


def adopt_lines(plan: PullRequestPlan, r: TargetResult) -> list[str]:
    """How to use one proposed change."""
    folder = _folder(r)
    if is_rewrite(r):
        return [f"Adopt: merge; `{r.file}` itself changes (the diff above), nothing else to import."]
    cls = r.class_name or r.target
    edited = next((p[1:] for p in sorted(r.files) if p.startswith("/")), None)
    if folder is None and not edited:
        return []
    if edited:
        return [f"Adopt: merge; `{edited}` binds `{cls}` to the drop-in (the lines added at its end: a subclass with "
                "the same constructor and `state_dict` keys, so existing checkpoints load). `FUSEBOT_DISABLE=1` keeps "
                "the original class; deleting those lines undoes it."]
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
    choice = manifest_of(r).get("choice")
    if choice:
        table += f"\n\nWhy this change: {choice}."
    return (f"<details><summary>Benchmark details: {r.class_name or r.target}</summary>\n\n{table}\n\n{env_line}"
            "\n\n</details>\n")


def _trace_block(r: TargetResult, text: str, cut: int) -> str:
    note = f"\n\n*…trace truncated ({cut} characters left out); `/fusebot explain` posts it whole.*" if cut else ""
    return (f"<details><summary>Search trace: {r.class_name or r.target}</summary>\n\n{text}{note}\n\n</details>")


def fit_traces(fixed: str, results: list[TargetResult], limit: int = BODY_LIMIT) -> list[str]:
    """Trace blocks (each clipped to TRACE_ROWS rows) that fit beside `fixed` within `limit`: each trace gets an
    equal share, cut at a line end."""
    traces = [(r, clip_trace(r.trace_markdown)) for r in results if r.trace_markdown]
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
             "", summary_table(plan.results), ""]
    declined = declined_lines(plan.results)
    if declined:
        parts += ["**Declined**:", *declined, ""]
    folders = {}
    for r in plan.improved:
        folder = _folder(r) or r.target
        folders[r.target] = folder
        env = r.verdict.environment if r.verdict and r.verdict.environment else plan.environment
        diff = rewrite_diff(r)
        parts += [compatibility(r, env, folder, plan.kernels_dir), "", *([diff, ""] if diff else []),
                  *adopt_lines(plan, r), ""]
    source = f" for #{plan.source_pr}" if plan.source_pr else ""
    tail = ["", footer(plan.results, plan.kernels_dir, folders), "", _commands_section(),
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


def _ms(x: float) -> str:
    return f"{x:.4g} ms"


def _spread(v: Verdict) -> str:
    c = v.confirmation
    if c is not None and c.rounds:
        per = c.speedup_vs_faster()
        return f"{min(per):.2f}-{max(per):.2f}x over {c.rounds} rounds"
    return f"IQR {v.timing.iqr_ms:.3g} ms, n {v.timing.n}" if v.timing else "n/a"


def _margin(r: TargetResult) -> str:
    m = manifest_of(r).get("margin")
    return f" (margin {100 * m:.0f}%)" if isinstance(m, int | float) else ""


def summary_table(results: list[TargetResult]) -> str:
    """One row per proposed target, and the PyTorch rewrite's row wherever one was verified and not proposed."""
    lines = ["| module | before → after (median) | speedup over the faster baseline | spread | % of floor | change |",
             "| --- | --- | ---: | --- | ---: | --- |"]
    for r in results:
        v, g = r.verdict, gain(r.verdict)
        if not r.improved or v is None or g is None:
            continue
        floor = f"{v.pct_of_floor:.0f}%" if v.pct_of_floor is not None else "n/a"
        change = f"{REWRITE_LABEL} of `{r.file}`" if is_rewrite(r) else "fused kernel + drop-in"
        lines.append(f"| `{name(r)}` | {_ms(g[1])} ({g[0]}) → {_ms(v.timing.median_ms)} | **{g[2]:.2f}x**{_margin(r)} "
                     f"| {_spread(v)} | {floor} | {change} |")
        other = (manifest_of(r).get("timings") or {}).get(REWRITE_LABEL)
        if other and not is_rewrite(r):
            lines.append(f"| `{name(r)}`: {REWRITE_LABEL} | {_ms(g[1])} ({g[0]}) → {_ms(other['median_ms'])} | "
                         f"{g[1] / other['median_ms']:.2f}x | IQR {other['iqr_ms']:.3g} ms, n {other['n']} | | "
                         "verified, not proposed |")
    return "\n".join(lines)


def declined_lines(results: list[TargetResult]) -> list[str]:
    return [f"- `{name(r)}`: {table_cell(r.message or 'no verified kernel', 600)}" for r in results if not r.improved]


def clip_trace(text: str, rows: int = TRACE_ROWS) -> str:
    """The trace with at most `rows` candidate rows (ideas and headings kept), saying how many were left out."""
    out, shown, left = [], 0, 0
    for line in text.splitlines():
        is_row = line.startswith("| ") and not line.startswith(("| candidate |", "| --- |"))
        if is_row and shown >= rows:
            left += 1
            continue
        shown += is_row
        out.append(line)
    note = f"\n\n*…{left} more candidate(s) left out; `/fusebot explain` posts the whole trace.*" if left else ""
    return "\n".join(out) + note


def _shapes(verified: dict) -> tuple[str, list[str]]:
    """("(4096, 1024) float32; (17, 1000) float32", ["float32"]) from the manifest's shapes."""
    sets, dtypes = [], []
    for s in verified.get("shapes") or []:
        ins = [f"({', '.join(map(str, t['shape']))}) {t['dtype']}" for t in s.get("inputs", [])]
        dtypes += [t["dtype"] for t in s.get("inputs", [])] + [t["dtype"] for t in s.get("outputs", [])]
        if ins:
            sets.append(" + ".join(ins))
    return "; ".join(sets), sorted(set(dtypes))


def _accuracy(v: Verdict, verified: dict) -> str:
    atol, rtol = verified.get("atol"), verified.get("rtol")
    tol = (f"atol {atol:g}, rtol {rtol:g} beyond eager's own error: every output element is as close to the float64 "
           "oracle as eager's, give or take atol + rtol × the oracle's magnitude") \
        if atol is not None and rtol is not None else \
        "the dtype's default tolerance beyond eager's own error against the float64 oracle"
    abs_e = [t.max_abs_err for t in v.trials if t.max_abs_err is not None]
    rel_e = [t.max_rel_err for t in v.trials if t.max_rel_err is not None]
    parts = [tol]
    oracle = [f"{k} {verified[f'oracle_{k}_err']:.3g}" for k in ("abs", "rel") if f"oracle_{k}_err" in verified]
    if oracle:
        parts.append("largest error against the float64 oracle: " + ", ".join(oracle))
    if abs_e and rel_e:
        parts.append(f"largest difference from eager: abs {max(abs_e):.3g}, rel {max(rel_e):.3g}")
    return "; ".join(parts)


def compatibility(r: TargetResult, env: Environment | None, folder: str, kernels_dir: str) -> str:
    """The compatibility block of one proposed target: what it runs on, what was verified, what works."""
    v = r.verdict
    m = manifest_of(r)
    verified = m.get("verified") or {}
    backend = verified.get("backend") or ("cuda" if env and env.gpu else "cpu")
    shapes, dtypes = _shapes(verified)
    passed = sum(1 for t in v.trials if t.passed) if v else 0
    sets = len({t.shape_set for t in v.trials}) if v else 0
    dists = len({t.distribution for t in v.trials if t.distribution}) if v else 0
    dev = device_text(env)
    cuda = backend == "cuda"
    lines = [f"#### `{name(r)}`: compatibility", "", "| | |", "| --- | --- |"]
    if is_rewrite(r):
        lines += [f"| Runs on | wherever the original runs: plain PyTorch, a change to `{r.file}` (timed on {dev}) |",
                  f"| Verified on | {shapes or f'{sets} shape set(s)'}: {passed} of {len(v.trials) if v else 0} "
                  f"trials passed over {dists} input distribution(s) |",
                  f"| Tolerance and accuracy | {_accuracy(v, verified)} |" if v else "",
                  f"| Autograd | {YES} plain PyTorch operations (fusebot verified the forward) |",
                  f"| torch.compile | {YES} plain PyTorch operations |",
                  f"| CUDA graphs, TorchScript | {UNKNOWN} as for any PyTorch code; not checked |",
                  f"| Other devices and dtypes | {YES} plain PyTorch; verified only as above |",
                  "| Needs at run time | nothing new: torch |",
                  "| Off switch | none: revert the commit to roll back |"]
        for pre in manifest_of(r).get("preconditions") or []:  # what no guard in the code tests
            lines.insert(4, f"| Precondition | equal to the original only where {pre} |")
        return "\n".join(x for x in lines if x)
    prebuilt = any(".so" in p.rsplit("/", 1)[-1] for p in r.files)  # kernel.<arch>.so.b64, runner-built
    device_code = any(p.endswith(".cubin.b64") for p in r.files)  # kernel.<arch>.cubin.b64: no host code
    builder = "nvcc (the CUDA toolkit)" if cuda else "a C++ compiler (g++)"
    why_none = manifest_of(r).get("no_device_code") if cuda else ""  # a CUDA kernel ships device code or nothing
    needs = ("torch and the CUDA driver only: device code ships beside the drop-in (the cubin, which `kernel.cu` "
             "makes again by the command its first line states, and PTX for later GPUs; sha256 checked), loaded "
             "through the driver API; no host code of the kernel runs" if device_code else
             f"torch, and {builder} to build `kernel.cu` on first use (cached); without it the original forward "
             f"runs. No binary ships: the device code was not made ({why_none}), and fusebot does not ship a host "
             "library" if why_none else
             f"torch only: the library built on the runner ships beside the drop-in (sha256 checked); {builder} only "
             "where it does not fit the host" if prebuilt else
             f"torch, and {builder} to build the kernel on first use (cached)")
    kinds = ", ".join(dtypes) or "the verified dtypes"
    lines += [f"| Runs on | {dev} ({backend} backend: `{folder}/"
              f"{'kernel.cu' if cuda else 'kernel.cpp'}`, called by `{folder}/dropin.py`) |",
              f"| Verified on | {shapes or f'{sets} shape set(s)'}: {passed} of {len(v.trials) if v else 0} trials "
              f"passed over {dists} input distribution(s) |",
              f"| Tolerance and accuracy | {_accuracy(v, verified)} |" if v else "",
              f"| Autograd | {YES} the drop-in defers to your original module whenever gradients are needed (the "
              "kernel is for inference) |",
              f"| torch.compile | {YES} the kernel is one custom op, traced with the original's output layout |",
              f"| CUDA graphs | {YES} captured and replayed in a CUDA graph by the drop-in's own test, which the "
              "runner ran on the GPU before proposing (the kernel launches on torch's current stream with memory "
              "from torch's allocator) |" if cuda else
              f"| CUDA graphs | {NO} a CPU kernel: CUDA tensors run the original forward |",
              f"| TorchScript (jit) | {NO} not accelerated: jit.script and jit.trace get the original forward |",
              f"| Other devices, dtypes, sizes | {NO} the kernel runs only on "
              f"{'this GPU model (another builds it for itself, logged)' if cuda else 'the CPU'}, {kinds}, at the "
              "verified sizes; anything else runs the original forward |",
              f"| Needs at run time | {needs} |",
              "| Off switch | `FUSEBOT_DISABLE=1` makes every drop-in run the original forward |"]
    return "\n".join(x for x in lines if x)


def rewrite_diff(r: TargetResult) -> str:
    """The rewrite's unified diff as a fenced block (cut to DIFF_CHARS, saying so), or ""."""
    diff = manifest_of(r).get("diff") or ""
    if not diff:
        return ""
    shown = diff if len(diff) <= DIFF_CHARS else diff[: diff.rfind("\n", 0, DIFF_CHARS) + 1]
    cut = "" if shown is diff else f"\n*…diff cut at {len(shown)} of {len(diff)} characters: see the PR's files.*"
    return f"#### The change: `{r.file}`\n\n```diff\n{shown.rstrip()}\n```{cut}"


def footer(results: list[TargetResult], kernels_dir: str, folders: dict[str, str]) -> str:
    """How to reproduce and roll back, and what closing the PR does (bot/features: closing cancels this PR's queued
    jobs only; the next run searches the module again)."""
    benches = [f"`python {kernels_dir}/{folders[r.target]}/bench_{folders[r.target]}.py`" for r in results
               if r.improved and r.target in folders]
    kernels = [r for r in results if r.improved and not is_rewrite(r)]
    lines = ["---", ""]
    if benches:
        lines.append(f"**Reproduce** the figures: {', '.join(benches)} (times the original against the change "
                     "the way fusebot's harness did, in alternating rounds; needs only torch)"
                     + (f"; correctness: `python -m pytest -q {kernels_dir}` (pytest checks correctness only)."
                        if kernels else "."))
    roll = ("**Roll back**: set `FUSEBOT_DISABLE=1` and every drop-in runs your original forward, no code change; or "
            "revert this PR's commit." if kernels else "**Roll back**: revert this PR's commit.")
    lines += ["", roll, "",
              "**Closing this PR** does not stop fusebot: the next labelled or nightly run searches these modules "
              "again and, if a change still wins, opens a new PR. To stop that, list the file under `ignore:` in "
              "`.github/fusebot.yml` or remove its `# fusebot: optimize` mark."]
    return "\n".join(lines)
