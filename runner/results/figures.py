"""A kernel's figures as its PR states them: its bench script run the way the PR tells a reader to run it, read back
as the harness's types, and judged (faster than the faster baseline by the minimum effect, in every round, and in
what a user's call costs: the drop-in as shipped, called back to back, host path included).

    figures = run_bench_script(root, kernels_dir, folder, threads=...)   # the script's JSON, or why there is none
    verdict = with_figures(verdict, figures, problem, folder)             # its timing, baselines and rounds
    holds, why = assessment(verdict, check)

A PR's figures and a `/fusebot benchmark` re-run of it come from this same script, so the two are measured alike.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

from runner.contract import DropinCheck, Verdict
from runner.harness.config import confirm_rounds_setting
from runner.harness.confirm import EXTREMES, margin, won_every_round
from runner.harness.sandbox import confined_env
from runner.results.bench_script import bench_filename, read_figures

BENCH_TIMEOUT_S = 900.0


def assessment(v: Verdict, check: DropinCheck | None = None) -> tuple[bool, str]:
    """(holds, why) for a re-measured kernel: verified by the harness and by its drop-in's test, and faster than the
    faster of eager and torch.compile (in every alternating round, when it was timed in rounds). Pure."""
    if not v.accepted:
        return False, "not verified: " + "; ".join(v.reasons[:3] or [f"rejected at {v.stage}"])
    if check is not None and not check.passed:
        return False, "not verified: its drop-in failed its own test (" + "; ".join(check.reasons) + ")"
    if v.degenerate:
        return False, "verified, but the problem is degenerate (its output does not depend on its input): no speedup"
    base = [(n, t) for n, t in (("eager", v.baselines.eager), ("torch.compile", v.baselines.compile)) if t] \
        if v.baselines else []
    if v.timing is None or not base:
        return True, f"verified; {'no baseline was measured' if v.timing else 'not timed'}"
    faster, base_t = min(base, key=lambda nt: nt[1].median_ms)
    ms, base_ms = v.timing.median_ms, base_t.median_ms
    spread = ""
    if v.confirmation is not None and v.confirmation.rounds:
        per_round = v.confirmation.speedup_vs_faster()
        m = margin(v.confirmation)
        spread = f"; {min(per_round):.2f}-{max(per_round):.2f}x over {v.confirmation.rounds} alternating rounds"
        if not won_every_round(v.confirmation):
            return False, (f"verified, but not faster than {faster} in every round"
                           f"{EXTREMES if v.confirmation.rounds >= 5 else ''}: {ms:.4g} ms against "
                           f"{base_ms:.4g} ms{spread}")
        if base_ms / ms < 1.0 + m:
            return False, (f"verified, but below the minimum effect: {base_ms / ms:.2f}x over {faster}, under the "
                           f"{100 * m:.0f}% margin ({ms:.4g} ms against {base_ms:.4g} ms{spread})")
        spread += f"; margin {100 * m:.0f}%"
    elif ms >= base_ms:
        return False, f"verified, but not faster: {ms:.4g} ms against {base_ms:.4g} ms for {faster}"
    user = user_call(v)
    if user is not None:  # what a user's call costs decides: the kernel's own time is not what a loop of calls pays
        who, mine_b2b, base_b2b = user
        need = 1.0 + margin(v.confirmation) if v.confirmation is not None and v.confirmation.rounds else 1.0
        if base_b2b / mine_b2b < need:
            return False, (f"verified, and its kernel is {base_ms / ms:.2f}x faster than {faster} with flushed caches, "
                           f"but a user's call is not: through the drop-in, back to back, {mine_b2b:.4g} ms a call "
                           f"against {base_b2b:.4g} ms for {who} ({base_b2b / mine_b2b:.2f}x"
                           f"{f', under the {100 * (need - 1):.0f}% margin' if need > 1 else ''})")
        spread += f"; a user's call back to back {base_b2b / mine_b2b:.2f}x ({mine_b2b:.4g} ms against {base_b2b:.4g} ms)"
    return True, f"verified; {ms:.4g} ms, {base_ms / ms:.2f}x faster than {faster} ({base_ms:.4g} ms{spread})"


def user_call(v: Verdict) -> tuple[str, float, float] | None:
    """(the faster baseline back to back, the change's ms a call back to back, that baseline's): what a user's call
    costs, where the bench script measured it for the change and every baseline; else None. Pure."""
    if v.timing is None or v.timing.back_to_back_ms is None or v.baselines is None:
        return None
    base = [(n, t.back_to_back_ms) for n, t in (("eager", v.baselines.eager), ("torch.compile", v.baselines.compile))
            if t is not None]
    if not base or any(ms is None for _, ms in base):
        return None
    who, ms = min(base, key=lambda nb: nb[1])
    return who, v.timing.back_to_back_ms, ms


def processes_for(backend: str) -> int:
    """How many processes a figure is measured in: on CUDA two, one after the other, their rounds pooled. On the
    H100 two runs of one bench script minutes apart timed torch.compile's 7 us module at 7.22-7.31 us and 6.86-6.99
    us: a figure from one process states a spread (0.754-0.761x) that the next process does not meet (0.719-0.721x).
    On the CPU one: the unstable-measurement rule and the thread count are what a CPU figure needs."""
    return 2 if backend == "cuda" else 1


def run_bench_script(root: Path, kernels_dir: str, folder: str, *, timeout_s: float = BENCH_TIMEOUT_S,
                     threads: int | None = None, processes: int = 1) -> dict | str:
    """`_run_bench_script` in `processes` processes one after the other, their rounds and samples pooled
    (`pooled`), or why there are no figures."""
    runs = []
    for _ in range(processes):
        figures = _run_bench_script(root, kernels_dir, folder, timeout_s=timeout_s, threads=threads)
        if not isinstance(figures, dict):
            return figures
        runs.append(figures)
    return pooled(runs)


def pooled(runs: list[dict]) -> dict:
    """Several runs of one bench script as one: every contestant's samples and round medians, in run order."""
    out = {**runs[0], "rounds": sum(r["rounds"] for r in runs), "processes": len(runs)}
    out["contestants"] = {name: {key: [x for r in runs for x in r["contestants"][name].get(key, [])]
                                 for key in ("samples_ms", "round_medians_ms", "back_to_back_ms")}
                          for name in runs[0]["contestants"]}
    return out


def _run_bench_script(root: Path, kernels_dir: str, folder: str, *, timeout_s: float,
                      threads: int | None) -> dict | str:
    """Run the folder's bench script from the repository root `root`, confined like every untrusted process: its
    figures (the script's JSON), or why there are none. `threads`: torch's CPU threads for every contestant, as many
    as the harness's CPU timing gives each (runner.harness.config.timing_cores), so that the figure a PR states and
    this re-measure compare eager and torch.compile on the same threads. It runs as many rounds as a search's
    confirmation (FUSEBOT_CONFIRM_ROUNDS, else the script's own default, the same number)."""
    script = f"{kernels_dir}/{folder}/{bench_filename(folder)}"
    if not (root / script).is_file():
        return f"no bench script ({script})"
    out = root / f".fusebot-bench-{folder}.json"
    cmd = [sys.executable, "-m", "runner.harness.sandbox", "--write", str(root), "--", sys.executable, script,
           "--json", str(out), "--rounds", str(confirm_rounds_setting(os.environ)),
           *(["--threads", str(threads)] if threads else [])]
    env = confined_env(root, base=dict(os.environ))
    env["FUSEBOT_DROPIN_CACHE"] = str(root / ".fusebot-dropin-cache")
    for name in ("TORCHINDUCTOR_CACHE_DIR", "TRITON_CACHE_DIR"):
        env[name] = str(root / f".{name.lower()}")
    try:
        done = subprocess.run(cmd, cwd=root, env=env, capture_output=True, text=True, timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return f"the bench script did not finish within {timeout_s:.0f} s"
    if done.returncode != 0 or not out.is_file():
        tail = (done.stdout + done.stderr).strip().splitlines()[-3:]
        return f"the bench script failed (exit status {done.returncode}): {' / '.join(tail)}"
    return json.loads(out.read_text())


def with_figures(v: Verdict | None, figures: dict | str | None, problem: str, folder: str, note: str = "") -> Verdict:
    """The verdict with the bench script's figures as its timing, baselines and rounds (why not, in a warning);
    `note` ends the warning that names the figures."""
    if v is None:  # a rewrite: timed only
        v = Verdict(candidate_id=f"rewrite-{folder}", problem=problem, accepted=True,
                    warnings=["a PyTorch rewrite: timed by its bench script here; fusebot's harness verified it when "
                              "it was proposed, not again"])
    if not isinstance(figures, dict):
        if figures:
            v = v.model_copy(update={"warnings": [*v.warnings, f"bench script: {figures}; the harness's figures "
                                                                "are shown"]})
        return v
    timing, baselines, conf = read_figures(figures)
    fb = min(t.median_ms for t in (baselines.eager, baselines.compile) if t is not None)
    return v.model_copy(update={
        "timing": timing, "baselines": baselines, "confirmation": conf,
        "speedup_vs_eager": baselines.eager.median_ms / timing.median_ms if baselines.eager else None,
        "speedup_vs_compile": baselines.compile.median_ms / timing.median_ms if baselines.compile else None,
        "pct_of_floor": 100.0 * v.roofline.floor_ms / timing.median_ms if v.roofline else None,
        "warnings": [*v.warnings, f"figures from `python {folder}/{bench_filename(folder)}` "
                                  f"({figures.get('device', '?')}{_threads(figures)}, {figures.get('rounds', '?')} "
                                  f"rounds{_processes(figures)}; the faster baseline {fb:.4g} ms){note}"]})


def _processes(figures: dict) -> str:
    n = figures.get("processes", 1)
    return f" in {n} processes" if n > 1 else ""


def _threads(figures: dict) -> str:
    """', N CPU thread(s)' for a script timed on the CPU (where the thread count is part of the figure)."""
    return f", {figures['threads']} CPU thread(s)" if figures.get("backend") == "cpu" and figures.get("threads") else ""


def stated(root: Path, kernels_dir: str, folder: str, problem: str, verdict: Verdict,
           check: DropinCheck | None, *, backend: str, timeout_s: float | None = None) -> tuple[Verdict, bool, str]:
    """The verdict a PR states, its figures its own bench script's (run here, in the scratch copy `root` holding the PR's
    files), whether they hold the claim, and what they say (`assessment`). The harness's figures stay in a
    warning. On CUDA the harness's timer (a lead behind the flush, the paired sync) and the script's differ: on
    the H100 a 7 us module measured 0.78x over torch.compile in the harness and 0.72x in its script, and the
    script is what a reader runs and what `/fusebot benchmark` re-runs."""
    before = set(root.iterdir())
    processes = processes_for(backend)
    figures = run_bench_script(root, kernels_dir, folder, processes=processes,
                               timeout_s=min(BENCH_TIMEOUT_S, timeout_s / processes) if timeout_s else BENCH_TIMEOUT_S)
    for made in set(root.iterdir()) - before:  # its figures file and caches (home, temporary files, compilers'):
        shutil.rmtree(made) if made.is_dir() and not made.is_symlink() else made.unlink()  # not the PR's
    if not isinstance(figures, dict):
        return verdict, False, f"its bench script gave no figures ({figures})"
    harness = ""
    if verdict.confirmation is not None and verdict.confirmation.rounds:
        per_round = verdict.confirmation.speedup_vs_faster()
        harness = f"; the harness measured {min(per_round):.2f}-{max(per_round):.2f}x over the faster baseline " \
                  f"in {verdict.confirmation.rounds} rounds"
    out = with_figures(verdict, figures, problem, folder, note=harness)
    holds, why = assessment(out, check)
    return out, holds, why
