"""`fusebot worker`'s settings refused before anything starts, each problem naming where it comes from: the
environment variable (as `fusebot serve` does), or the flag that gave it; and `-h` that starts with a summary."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from bot import cli
from runner.cli import worker
from runner.contract import ExitStatus

TOKEN = "a-runner-token-0123456789abcdef"


@pytest.fixture
def bare_env(monkeypatch):
    for name in ("FUSEBOT_WORKER_BOT_URL", "FUSEBOT_WORKER_TOKEN", "FUSEBOT_WORKER_GPU_INDEX"):
        monkeypatch.delenv(name, raising=False)


def test_nothing_set_names_each_environment_variable(bare_env):
    r = CliRunner().invoke(worker.app, [])
    assert r.exit_code == ExitStatus.USAGE
    assert r.output.splitlines()[:2] == ["error: FUSEBOT_WORKER_BOT_URL is not set (or pass --bot)",
                                         "error: FUSEBOT_WORKER_TOKEN is not set"]
    assert "Field required" not in r.output and "bot_url" not in r.output


def test_a_bad_value_names_the_flag_that_gave_it_and_never_the_token(bare_env, monkeypatch):
    monkeypatch.setenv("FUSEBOT_WORKER_TOKEN", "changeme")
    r = CliRunner().invoke(worker.app, ["--bot", "ftp://bot"])
    assert r.exit_code == ExitStatus.USAGE
    assert r.output.splitlines()[:2] == [
        "error: --bot: must be an http(s) URL",
        "error: FUSEBOT_WORKER_TOKEN: the runner token is missing, a placeholder or shorter than 16 characters"]
    monkeypatch.setenv("FUSEBOT_WORKER_BOT_URL", "bot.example.com")
    monkeypatch.setenv("FUSEBOT_WORKER_TOKEN", TOKEN)
    r = CliRunner().invoke(worker.app, [])
    assert r.output.splitlines()[0] == "error: FUSEBOT_WORKER_BOT_URL: must be an http(s) URL" and TOKEN not in r.output


@pytest.mark.parametrize("flag", ["-h", "--help"])
def test_help_starts_with_a_summary(flag):
    for app, args in ((worker.app, [flag]), (cli.app, ["worker", flag])):
        r = CliRunner().invoke(app, args)
        assert r.exit_code == 0, r.output
        assert r.output.splitlines()[2].strip() == "Lease units of work from a fusebot bot and run them on this GPU " \
                                                   "host."
