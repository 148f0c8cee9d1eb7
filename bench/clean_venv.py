"""A virtualenv that holds torch, pytest and the libraries named, and nothing else: the distributions of their
requirement closure, linked from this interpreter's site-packages into a fresh venv without pip (the GPU machine
has no network). fusebot is never in it unless named.

    python bench/clean_venv.py /tmp/clean                      # torch and pytest
    python bench/clean_venv.py /tmp/clean --with transformers  # and a module's own library

Prints the distributions linked, one line.
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import logging
import re
import sys
import venv
from pathlib import Path

from packaging.requirements import Requirement

log = logging.getLogger("clean_venv")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def closure(roots: list[str]) -> dict[str, md.Distribution]:
    """The installed distributions `roots` need, theirs included (requirements whose markers hold here, no extras);
    a requirement that is not installed is left out (an optional one)."""
    found: dict[str, md.Distribution] = {}
    todo = list(roots)
    while todo:
        name = todo.pop()
        if canonical(name) in found:
            continue
        try:
            dist = md.distribution(name)
        except md.PackageNotFoundError:
            if name in roots:
                raise SystemExit(f"{name} is not installed in {sys.executable}") from None
            continue
        found[canonical(name)] = dist
        for text in dist.requires or []:
            req = Requirement(text)
            if req.marker is None or req.marker.evaluate({"extra": ""}):
                todo.append(req.name)
    return found


def top_levels(dist: md.Distribution) -> set[Path]:
    """What `dist` installed at the top of its site-packages (packages, modules, .dist-info, bundled libraries)."""
    tops = set()
    for f in dist.files or []:
        if f.parts and f.parts[0] not in ("..", "__pycache__"):
            tops.add(Path(str(dist.locate_file(f.parts[0]))))
    return tops


def make(target: Path, roots: list[str]) -> list[str]:
    venv.create(target, with_pip=False, symlinks=True, clear=True)
    site = target / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"
    dists = closure(roots)
    for dist in dists.values():
        for src in top_levels(dist):
            dst = site / src.name
            if src.exists() and not dst.exists():
                dst.symlink_to(src)
    return sorted(dists)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("target", type=Path)
    ap.add_argument("--with", dest="extra", action="append", default=[], metavar="DIST")
    args = ap.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    log.info("linked: %s", " ".join(make(args.target, ["torch", "pytest", *args.extra])))


if __name__ == "__main__":
    main()
