"""`-h` beside `--help` on every command line of the project: each Typer app in bot/, runner/ and tests/fakes/ (found
in the source, so a new one is covered), and each of its subcommands, answers `-h` with its usage."""

from __future__ import annotations

import importlib
from pathlib import Path

import pytest
import typer
from typer.main import get_command
from typer.testing import CliRunner

ROOT = Path(__file__).resolve().parents[1]


FACTORY = ROOT / "runner/cli/common.py"  # app(): the Typer of eval, optimize and bench


def app_modules() -> list[str]:
    files = [p for d in ("bot", "runner", "tests/fakes") for p in (ROOT / d).rglob("*.py")
             if p != FACTORY and ("typer.Typer(" in p.read_text() or "_app = app(" in p.read_text())]
    return sorted(".".join(p.relative_to(ROOT).with_suffix("").parts) for p in files)


def test_the_apps_are_found():
    assert {"bot.cli", "bot.web.server", "runner.cli.worker", "runner.cli.eval", "tests.fakes.local_github"} <= \
        set(app_modules())


@pytest.mark.parametrize("module", app_modules())
def test_every_command_answers_dash_h(module):
    apps = [v for v in vars(importlib.import_module(module)).values() if isinstance(v, typer.Typer)]
    assert apps, f"{module} has no Typer app at module level"
    for app in apps:
        names = [[]] + [[name] for name in getattr(get_command(app), "commands", {})]
        for args in names:
            r = CliRunner().invoke(app, [*args, "-h"])
            assert r.exit_code == 0 and "Usage:" in r.output, (module, args, r.output)
