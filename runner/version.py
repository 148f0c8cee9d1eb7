"""fusebot's version as a result and a PR state it: the installed package's version, and the commit of the checkout it
runs from where that is a git work tree (FUSEBOT_COMMIT names it where the tree's .git is absent or stale)."""

from __future__ import annotations

import functools
import os
import subprocess
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def fusebot_version() -> str:
    """"0.1.0+g1a2b3c4d5e6f" from a checkout, "0.1.0" from an installed wheel, "unreleased+g..." where the package is
    not installed; never "unknown" while a commit can be named."""
    try:
        release = version("fusebot")
    except PackageNotFoundError:
        release = "unreleased"
    commit = os.environ.get("FUSEBOT_COMMIT", "").strip() or _checkout_commit()
    return f"{release}+g{commit[:12]}" if commit else release


def _checkout_commit() -> str:
    if not (ROOT / ".git").exists():
        return ""
    try:
        done = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return ""
    return done.stdout.strip() if done.returncode == 0 else ""
