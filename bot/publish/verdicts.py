"""One target's result as text, as the PR body, the check runs and the comments all show it: the speedup, the
benchmark table with its correctness line, the environment line, the one-line verdict; and what the result's
manifest (`fusebot.json`, runner/results/proposal.py) says of it. Every number comes from a Verdict the harness
produced; numbers are formatted here for display only.
"""

from __future__ import annotations

import json

from runner.contract import Environment, TargetResult, Verdict, benchmark_table, faster_baseline

MANIFEST_SUFFIX = "/fusebot.json"
REWRITE_LABEL = "PyTorch rewrite"


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
    """A PyTorch rewrite: its manifest says so, or (a manifest without `change`) it changes a repository file and
    ships no drop-in (a kernel's PR may change the module's file too: the edit that adopts its drop-in)."""
    change = manifest_of(r).get("change")
    if change:
        return change == "rewrite"
    return any(p.startswith("/") for p in r.files) and not any(p.endswith("/dropin.py") for p in r.files)


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
    return f"{x:.4g}"


def times(ratio: float | None) -> str:
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
    label = f"**{REWRITE_LABEL}**" if is_rewrite(r) else "**fusebot**"
    lines = [head, "", with_rewrite_row(benchmark_table(v.baselines, v.timing, v.roofline, label), r)]
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
        first = "the PyTorch rewrite" if is_rewrite(r) else "fusebot"
        lines += [f"Timed in {c.rounds} alternating rounds ({first}, eager, torch.compile, ...), {where}: speedup "
                  f"over the faster baseline per round {per_round}."]
    if (user := user_call_line(v)) is not None:
        lines += [user]
    lines += [f"> {w}" for w in v.warnings]
    if not r.improved and r.message:
        lines += ["", f"Not proposed: {r.message}"]
    return "\n".join(lines)


def user_call_line(v: Verdict) -> str | None:
    """What a user's call costs beside the kernel's own time, where the bench script measured it for every contestant:
    the module as shipped called back to back, host path included. None otherwise."""
    t, b = v.timing, v.baselines
    named = [(n, x) for n, x in (("eager", b.eager if b else None), ("torch.compile", b.compile if b else None)) if x]
    if t is None or t.back_to_back_ms is None or not named or any(x.back_to_back_ms is None for _, x in named):
        return None
    who, faster = min(named, key=lambda nx: nx[1].back_to_back_ms)
    what = "the drop-in as shipped" if t.call != "module" else "the module as changed"
    others = " and ".join(f"{x.back_to_back_ms:.4g} ms for {n}" for n, x in named)
    return (f"What a user's call costs ({what}, called back to back, host path included): {t.back_to_back_ms:.4g} ms "
            f"against {others}: **{faster.back_to_back_ms / t.back_to_back_ms:.2f}x** over {who}; "
            f"{'the change' if t.call == 'module' else 'the kernel'}'s own time with flushed caches is "
            f"{t.median_ms:.4g} ms.")


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


def environment_line(env: Environment | None) -> str:
    if env is None:
        return "Environment: not reported."
    device = env.gpu or env.cpu or env.device
    return (f"Measured on **{device}**; driver {env.driver or 'n/a'}, CUDA {env.cuda or 'n/a'}, torch {env.torch}, "
            f"Python {env.python}, fusebot {env.fusebot}. Times are medians of n calls (cache flushed before each); "
            "spread is the interquartile range.")


def verdict_line(results: list[TargetResult]) -> str:
    won = [r for r in results if r.improved]
    if not won:
        return (f"**Nothing proposed** for {len(results)} target(s): no change was verified and proven faster than "
                "both PyTorch eager and torch.compile; each target's reason says which.")
    parts = []
    for r in won:
        fb, s = faster_baseline(r.verdict.baselines) if r.verdict else None, speedup(r.verdict)
        what = "a PyTorch rewrite of" if is_rewrite(r) else "a fused kernel for"
        parts.append(f"{what} `{r.class_name or r.target}`, **{times(s)}** faster than {fb[0] if fb else 'the baseline'}")
    devices = sorted({device_text(r.verdict.environment) for r in won if r.verdict and r.verdict.environment})
    where = f" on {', '.join(devices)}" if devices else ""
    declined = len(results) - len(won)
    rest = f"; {declined} of {len(results)} target(s) declined" if declined else ""
    return "**Proposed**: " + "; ".join(parts) + f"{where}{rest}."
