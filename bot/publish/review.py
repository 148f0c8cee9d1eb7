"""The parts of a fusebot PR body a reviewer reads first: pure text from TargetResults and their manifests.

    summary_table(results)          module, before -> after, speedup over the faster baseline, spread, % of floor
    compatibility(r, env, ...)      device and backend, shapes and dtypes verified, tolerance and accuracy, what
                                    works (autograd, torch.compile, CUDA graphs, jit, other devices), run-time needs
    declined_lines(results)         one line per target not proposed
    footer(...)                     how to reproduce, how to roll back, what closing the PR does

What was verified and every contestant's timing come from the result's manifest (`fusebot.json`, written by
runner/results/proposal.py); the drop-in's behaviour is its contract (runner/harness/dropin.py): it defers to the
original module whenever gradients are needed, falls back to the original forward outside the verified sizes, dtypes
and devices, and `FUSEBOT_DISABLE=1` turns it off.
"""

from __future__ import annotations

import json

from runner.contract import Environment, TargetResult, Verdict, faster_baseline, table_cell

MANIFEST_SUFFIX = "/fusebot.json"
REWRITE_LABEL = "PyTorch rewrite"
DIFF_CHARS = 6000  # a rewrite's diff shown in the body at most; the PR's files hold it whole
YES, NO, UNKNOWN = "✅", "❌", "❔"


def manifest_of(r: TargetResult) -> dict:
    """The result's fusebot.json, parsed ({} when it has none or it does not parse)."""
    for path, text in sorted(r.files.items()):
        if path.endswith(MANIFEST_SUFFIX) or path == MANIFEST_SUFFIX[1:]:
            try:
                data = json.loads(text)
            except ValueError:
                return {}
            return data if isinstance(data, dict) else {}
    return {}


def is_rewrite(r: TargetResult) -> bool:
    return manifest_of(r).get("change") == "rewrite" or any(p.startswith("/") for p in r.files)


def name(r: TargetResult) -> str:
    return r.class_name or r.target


def device_text(env: Environment | None) -> str:
    """The GPU's name, or "CPU <model>"."""
    if env is None:
        return "an unreported device"
    if env.gpu:
        return env.gpu
    return f"CPU {env.cpu}" if env.cpu else "CPU"


def gain(v: Verdict | None) -> tuple[str, float, float] | None:
    """(faster baseline's name, its median ms, speedup over it) or None."""
    fb = faster_baseline(v.baselines) if v else None
    if v is None or v.timing is None or fb is None or v.timing.median_ms <= 0:
        return None
    return fb[0], fb[1].median_ms, fb[1].median_ms / v.timing.median_ms


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


def with_rewrite_row(table: str, r: TargetResult) -> str:
    """A benchmark table (runner.contract.benchmark_table) with the PyTorch rewrite's row, from the manifest, when one
    was verified beside the proposed kernel; the columns: median, IQR, n, vs eager, vs torch.compile, % of floor."""
    other = (manifest_of(r).get("timings") or {}).get(REWRITE_LABEL)
    v = r.verdict
    if not other or is_rewrite(r) or v is None:
        return table
    ms = other["median_ms"]
    b = v.baselines

    def vs(t) -> str:
        return f"{t.median_ms / ms:.2f}x" if t is not None else "n/a"

    floor = f"{100 * v.roofline.floor_ms / ms:.2f}%" if v.roofline else "n/a"
    row = (f"| {REWRITE_LABEL} (not proposed) | {ms:.4g} | {other['iqr_ms']:.3g} | {other['n']} | "
           f"{vs(b.eager if b else None)} | {vs(b.compile if b else None)} | {floor} | n/a |")
    lines = table.splitlines()
    at = next((i for i, line in enumerate(lines) if line.startswith("| roofline floor |")), len(lines))
    return "\n".join([*lines[:at], row, *lines[at:]])


TRACE_ROWS = 25  # table rows of one search trace shown in the body; `/fusebot explain` posts all


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


# ---- compatibility ------------------------------------------------------------------------------------------------

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
        return "\n".join(x for x in lines if x)
    prebuilt = any(".so" in p.rsplit("/", 1)[-1] for p in r.files)  # kernel.<arch>.so.b64, runner-built
    builder = "nvcc (the CUDA toolkit)" if cuda else "a C++ compiler (g++)"
    needs = (f"torch only: the library built on the runner ships beside the drop-in (sha256 checked); {builder} only "
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
              f"| CUDA graphs | {YES} the kernel launches on torch's current stream with memory from torch's "
              "allocator (not checked under capture by fusebot) |" if cuda else
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


# ---- footer -------------------------------------------------------------------------------------------------------

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
    roll = ["**Roll back**: "]
    if kernels:
        roll.append("set `FUSEBOT_DISABLE=1` and every drop-in runs your original forward, no code change; ")
    roll.append("or revert this PR's commit.")
    lines += ["", "".join(roll), "",
              "**Closing this PR** does not stop fusebot: the next labelled or nightly run searches these modules "
              "again and, if a change still wins, opens a new PR. To stop that, list the file under `ignore:` in "
              "`.github/fusebot.yml` or remove its `# fusebot: optimize` mark."]
    return "\n".join(lines)
