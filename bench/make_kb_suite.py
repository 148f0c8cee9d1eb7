"""Copy the problems listed in a suite file (default bench/suites/catalog.txt) from a local KernelBench checkout into
a folder for `fusebot bench` (default out/kb-suite, which git ignores: KernelBench's files are never committed).

    python bench/make_kb_suite.py --kernelbench ~/KernelBench [--suite bench/suites/catalog.txt] [--out out/kb-suite]

Files keep their names with the level as a prefix (level1_23_Softmax.py) so both levels share one folder.
"""

from __future__ import annotations

import argparse
import logging
import shutil
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
log = logging.getLogger("make_kb_suite")


def listed(suite: Path) -> list[str]:
    return [ln.strip() for ln in suite.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]


def main(argv: list[str]) -> int:
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kernelbench", type=Path, required=True, help="a KernelBench checkout (its root)")
    ap.add_argument("--suite", type=Path, default=ROOT / "bench" / "suites" / "catalog.txt")
    ap.add_argument("--out", type=Path, default=ROOT / "out" / "kb-suite")
    args = ap.parse_args(argv)
    base = args.kernelbench / "KernelBench" if (args.kernelbench / "KernelBench").is_dir() else args.kernelbench
    args.out.mkdir(parents=True, exist_ok=True)
    missing = []
    for rel in listed(args.suite):
        src = base / rel
        if not src.is_file():
            missing.append(rel)
            continue
        shutil.copyfile(src, args.out / rel.replace("/", "_"))
    log.info("%d problems in %s%s", len(listed(args.suite)) - len(missing), args.out,
             f"; missing: {', '.join(missing)}" if missing else "")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
