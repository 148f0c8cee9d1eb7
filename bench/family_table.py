"""One run of bench/realworld_floor.py (bench/family_floor.sh) -> README.md and results.json: per problem the floor,
eager, torch.compile and every catalog candidate it timed, in ms and as % of the floor.

    python bench/family_table.py rows.json --gpu "NVIDIA H200, 580.159.04" --out bench/results/h200-rope-softmax
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path


def pct(floor: float | None, ms: float | None) -> str:
    return f"{100 * floor / ms:.1f}%" if floor and ms else "-"


def num(ms: float | None) -> str:
    return f"{ms:.4g}" if ms else "-"


def table(run: dict) -> list[str]:
    out = ["| problem | floor ms | eager ms | % of floor | torch.compile ms | % of floor | best fusebot ms | % of floor "
           "| vs compile | best kernel | every candidate (ms) |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- | --- |"]
    for r in run["rows"]:
        floor, eager, comp, best = r.get("floor_ms"), r.get("eager_ms"), r.get("compile_ms"), r.get("best_ms")
        vs = f"{comp / best:.2f}x" if comp and best else "-"
        each = ", ".join(f"{c['label']} {num(c['median_ms'])}" if c["median_ms"] else f"{c['label']} rejected"
                         for c in r.get("candidates", []))
        out.append(f"| {r['problem']} | {num(floor)} | {num(eager)} | {pct(floor, eager)} | {num(comp)} | "
                   f"{pct(floor, comp)} | {num(best)} | {pct(floor, best)} | {vs} | "
                   f"{r.get('best_label') or r.get('error', '-')} | {each} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("rows", type=Path)
    ap.add_argument("--gpu", required=True, help="the machine, as nvidia-smi names it, and its driver")
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--title", default="RoPE and causal softmax against the memory floor")
    ap.add_argument("--command", default="OUT=<folder> bash bench/family_floor.sh",
                    help="the command line that made it, after gpu_setup.sh")
    ap.add_argument("--note", default="", help="a paragraph after the method's (what the run compares)")
    args = ap.parse_args()
    run = json.loads(args.rows.read_text())
    env = {**run["environment"], "gpu_driver": args.gpu}
    lines = table(run)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"environment": env, "rows": run["rows"]}, indent=1) + "\n")
    head = [f"# {args.title} ({args.gpu})", "",
            f"fusebot {env.get('commit', '')[:12]}, torch {env.get('torch')}. Builtin catalog, no search: the first "
            "parameter set of each of the catalog's first strategies, built, verified against the float64 oracle and "
            "timed by the harness (median, L2 flushed). The floor is bytes moved / the copy rate the harness measured. "
            "Problems not listed were not reached before the run's deadline. A causal softmax whose kernel skips "
            "the masked half (runner/catalog/skipping.py) reads fewer bytes than the floor counts, so it can pass "
            "100%.", "", *([args.note, ""] if args.note else []),
            f"    source bench/gpu_setup.sh && {args.command}", ""]
    (args.out / "README.md").write_text("\n".join(head + lines) + "\n")
    sys.stdout.write("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
