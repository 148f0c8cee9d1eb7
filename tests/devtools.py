"""Linters that the dev dependencies ship as binaries (pyproject.toml's `dev` extra): found beside this Python first,
then on PATH. A missing one fails the test that needs it: CI installs them (scripts/bootstrap.sh)."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path


def dev_tool(name: str, package: str) -> str:
    exe = Path(sys.executable).parent / name
    found = str(exe) if exe.exists() else shutil.which(name)
    assert found, f"{name} is a dev dependency ({package}): run scripts/bootstrap.sh"
    return found
