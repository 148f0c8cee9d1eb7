"""The `fusebot` entry: `--version`, `-h` on it and on every subcommand, and `fusebot serve` without its settings
naming the environment variable of each missing or invalid one (never a value)."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from importlib.metadata import version
from pathlib import Path

import pytest

from runner.version import fusebot_version

ROOT = Path(__file__).resolve().parents[2]


def fusebot(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOT_") and k != "DATABASE_URL"}
    return subprocess.run([sys.executable, "-m", "bot.cli", *args], cwd=ROOT, env=base | (env or {}),
                          capture_output=True, text=True, timeout=120)


def test_version():
    p = fusebot("--version")
    assert p.returncode == 0 and p.stdout == f"fusebot {fusebot_version()}\n"
    assert p.stdout.startswith(f"fusebot {version('fusebot')}+g")  # the release, and the checkout's commit


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_on_the_command_and_its_subcommands(flag):
    top = fusebot(flag)
    assert top.returncode == 0 and top.stdout.startswith("Usage: fusebot [OPTIONS] COMMAND [ARGS]...")
    assert "--version" in top.stdout and "-h, --help" in top.stdout and "<bool>" not in top.stdout
    for name in ("eval", "optimize", "bench", "serve", "worker", "demo", "action"):
        sub = fusebot(name, flag)
        assert sub.returncode == 0, sub.stderr
        assert f"Usage: fusebot {name} [OPTIONS]" in sub.stdout
        # click's plain layout: no boxes, no type tags, metavars in capitals (or the values a flag takes)
        assert "╭" not in sub.stdout and not re.search(r"<(bool|str|int|path|float)", sub.stdout), sub.stdout


def test_no_subcommand_imports_torch_before_it_runs():
    """A subcommand's module (what its help and a usage error need) imports neither torch nor the harness: `fusebot
    eval -h` answers without torch's few seconds of start-up; the command loads them when it runs."""
    probe = ("import importlib, sys\nfrom bot.cli import COMMANDS\n"
             "for target, _ in COMMANDS.values():\n    importlib.import_module(target.split(':')[0])\n"
             "print(sorted(m for m in sys.modules if m == 'torch' or m.startswith('runner.harness.evaluator')))")
    p = subprocess.run([sys.executable, "-c", probe], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0 and p.stdout.strip() == "[]", p.stdout + p.stderr


def test_serve_without_settings_names_each_environment_variable():
    p = fusebot("serve")
    assert p.returncode == 2 and p.stdout == ""
    lines = p.stderr.splitlines()
    assert lines[:3] == ["error: FUSEBOT_APP_ID is not set", "error: FUSEBOT_WEBHOOK_SECRET is not set",
                         "error: FUSEBOT_RUNNER_TOKENS is not set"]
    assert "Field required" not in p.stderr and "app_id" not in p.stderr


def test_serve_with_invalid_settings_names_each_variable_and_no_value():
    p = fusebot("serve", env={"FUSEBOT_APP_ID": "-3", "FUSEBOT_WEBHOOK_SECRET": "changeme",
                              "FUSEBOT_RUNNER_TOKENS": '{"gpu-1": "tooshort-token"}', "DATABASE_URL": "mysql://x"})
    assert p.returncode == 2
    errors = [ln for ln in p.stderr.splitlines() if ln.startswith("error: ")]
    assert errors == ["error: FUSEBOT_APP_ID: Input should be greater than 0",
                      "error: FUSEBOT_WEBHOOK_SECRET is a placeholder: set a real secret",
                      "error: FUSEBOT_RUNNER_TOKENS: runner token 'gpu-1' is shorter than 16 characters",
                      "error: FUSEBOT_DATABASE_URL must be sqlite:///PATH or postgresql://USER@HOST/DB"]
    assert "changeme" not in p.stderr and "tooshort-token" not in p.stderr and "mysql://x" not in p.stderr
