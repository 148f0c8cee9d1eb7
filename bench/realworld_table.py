"""The floor table of bench/realworld_floor.sh: its before and after JSON for one dtype -> rows of a README table
and one results.json (both runs as measured, and the machine they ran on).

    python bench/realworld_table.py before-fp32.json after-fp32.json --before-commit C --after-commit C \
        --gpu "NVIDIA H200" --driver 580.159.04 --out bench/results/h200-realworld-fp32
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


def rows_md(before: dict, after: dict) -> list[str]:
    """One line per problem: floor, torch.compile, the best verified candidate before and after, each in ms and as
    % of the floor, and after against torch.compile."""
    old = {r["problem"]: r for r in before["rows"]}
    out = ["| problem | floor ms | torch.compile ms | % of floor | before ms | % of floor | after ms | % of floor | "
           "after vs compile | after's kernel |",
           "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | --- |"]
    for r in after["rows"]:
        b = old.get(r["problem"], {})
        floor, comp, was, now = r.get("floor_ms"), r.get("compile_ms"), b.get("best_ms"), r.get("best_ms")
        vs = f"{comp / now:.2f}x" if comp and now else "-"
        why = r.get("error") or ("" if now else "; ".join(c["reason"][:80] for c in r.get("candidates", [])[:1]))
        out.append(f"| {r['problem'].split('/')[1]} | {num(floor)} | {num(comp)} | {pct(floor, comp)} | {num(was)} | "
                   f"{pct(floor, was)} | {num(now)} | {pct(floor, now)} | {vs} | {r.get('best_label') or why} |")
    return out


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("before", type=Path)
    ap.add_argument("after", type=Path)
    ap.add_argument("--before-commit", required=True)
    ap.add_argument("--after-commit", required=True)
    ap.add_argument("--gpu", required=True)
    ap.add_argument("--driver", required=True)
    ap.add_argument("--out", type=Path, required=True)
    args = ap.parse_args()
    before, after = json.loads(args.before.read_text()), json.loads(args.after.read_text())
    env = {"gpu": args.gpu, "driver": args.driver, "torch": after["environment"]["torch"],
           "before_commit": args.before_commit, "after_commit": args.after_commit}
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps({"environment": env, "before": before["rows"],
                                                       "after": after["rows"]}, indent=1) + "\n")
    sys.stdout.write("\n".join(rows_md(before, after)) + "\n")


if __name__ == "__main__":
    main()
