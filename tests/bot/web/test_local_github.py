"""tests/fakes/local_github.py, the README's "Trying the App on one machine": `setup`, `serve`, a real `fusebot serve`
on the settings it wrote, and `label` sending the signed webhook. The delivery becomes a queued job after the bot's
real requests to the fake GitHub (token, config, permission, changed files, check run). Then the conversation:
`comment "/fusebot status"` is answered (and reacted to), and `show` reads back the comments and check runs. The
worker's half of the loop (lease, search, result, PR) is tests/bot/test_worker.py's and test_action_search.py's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.fakes.serve import free_port

ROOT = Path(__file__).resolve().parents[3]
SETTINGS = {"FUSEBOT_APP_ID", "FUSEBOT_PRIVATE_KEY_PATH", "FUSEBOT_WEBHOOK_SECRET", "FUSEBOT_RUNNER_TOKENS",
            "FUSEBOT_WORKER_TOKEN", "FUSEBOT_GITHUB_API_URL", "FUSEBOT_GIT_URL_TEMPLATE", "DATABASE_URL",
            "FUSEBOT_DATA_DIR"}


def tool(*args: str, **kw) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "tests.fakes.local_github", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, **kw)


def read_env(path: Path) -> dict[str, str]:
    return dict(re.findall(r"^export (\w+)='([^']*)'$", path.read_text(), re.M))


@pytest.fixture
def procs() -> Iterator[list[subprocess.Popen]]:
    started: list[subprocess.Popen] = []
    yield started
    for p in started:
        p.terminate()
        try:
            p.wait(20)
        except subprocess.TimeoutExpired:
            p.kill()


def wait_for(url: str, proc: subprocess.Popen, log: Path, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, log.read_text()[-3000:]
        try:
            httpx.get(url, timeout=1)
            return
        except httpx.TransportError:
            time.sleep(0.2)
    raise AssertionError(f"{url} did not answer:\n{log.read_text()[-3000:]}")


def test_a_labelled_pr_on_the_local_github_becomes_a_queued_job(tmp_path: Path, procs: list[subprocess.Popen]):
    work = tmp_path / "local"
    done = tool("setup", "--workdir", str(work))
    assert done.returncode == 0, done.stderr
    env_file = work / "env.sh"
    settings = read_env(env_file)
    assert set(settings) >= SETTINGS and oct(env_file.stat().st_mode & 0o777) == "0o600"
    assert settings["FUSEBOT_GITHUB_API_URL"] in done.stdout and settings["FUSEBOT_WEBHOOK_SECRET"] not in done.stdout
    again = tool("setup", "--workdir", str(work), env={**os.environ, "COLUMNS": "300"})  # rich wraps the message
    assert again.returncode == 2 and "set up before" in again.stderr

    github_log = (tmp_path / "github.log").open("w")
    procs.append(subprocess.Popen([sys.executable, "-m", "tests.fakes.local_github", "serve", "--workdir", str(work)],
                                  cwd=ROOT, stdout=github_log, stderr=subprocess.STDOUT))
    # a documented endpoint (401 without a token): anything else would count as a request outside GitHub's API
    wait_for(settings["FUSEBOT_GITHUB_API_URL"] + "/repos/Codertocat/Hello-World", procs[-1], tmp_path / "github.log")
    port = free_port()
    bot_log = (tmp_path / "bot.log").open("w")
    env = {**os.environ, **settings, "PYTHONPATH": str(ROOT)}
    procs.append(subprocess.Popen([sys.executable, "-m", "bot.cli", "serve", "--port", str(port)], cwd=tmp_path,
                                  env=env, stdout=bot_log, stderr=subprocess.STDOUT))
    bot = f"http://127.0.0.1:{port}"
    wait_for(f"{bot}/healthz", procs[-1], tmp_path / "bot.log")

    sent = tool("label", "--workdir", str(work), "--bot", bot)
    assert sent.returncode == 0 and sent.stdout.startswith("202 "), sent.stdout + sent.stderr
    deadline = time.monotonic() + 60
    while 'fusebot_jobs{state="queued"} 1.0' not in httpx.get(f"{bot}/metrics").text:
        assert time.monotonic() < deadline, (tmp_path / "bot.log").read_text()[-3000:]
        time.sleep(0.5)
    time.sleep(1)  # the fake's log is written every half second
    github = (tmp_path / "github.log").read_text()
    for call in ("POST /app/installations/1/access_tokens -> 201",
                 "GET /repos/Codertocat/Hello-World/collaborators/maintainer/permission -> 200",
                 "GET /repos/Codertocat/Hello-World/pulls/1/files -> 200",
                 "POST /repos/Codertocat/Hello-World/check-runs -> 201"):
        assert call in github, github[-3000:]
    assert "outside GitHub's OpenAPI description" not in github
    for text in (github, (tmp_path / "bot.log").read_text(), sent.stdout):
        assert settings["FUSEBOT_WEBHOOK_SECRET"] not in text and settings["FUSEBOT_WORKER_TOKEN"] not in text

    asked = tool("comment", "--workdir", str(work), "--bot", bot, "/fusebot status")
    assert asked.returncode == 0 and asked.stdout.startswith("202 "), asked.stdout + asked.stderr
    deadline = time.monotonic() + 60
    while "<!-- fusebot:status -->" not in (shown := tool("show", "--workdir", str(work))).stdout:
        assert time.monotonic() < deadline, shown.stdout + shown.stderr + (tmp_path / "bot.log").read_text()[-3000:]
        time.sleep(0.5)
    assert "## maintainer at " in shown.stdout and "/fusebot status" in shown.stdout
    assert "## fusebot[bot] at " in shown.stdout and "| label | queued | 0 |" in shown.stdout
    assert "## fusebot: queued: Queued: 1 target(s)" in shown.stdout
    time.sleep(1)
    github = (tmp_path / "github.log").read_text()
    assert "POST /repos/Codertocat/Hello-World/issues/comments/" in github and "/reactions -> 201" in github
    assert re.search(r"reaction \d+: \d+ \| \+1", github) and "outside GitHub's OpenAPI description" not in github


def test_no_bot_or_no_github_is_said_in_one_line_with_what_starts_it(tmp_path: Path):
    work = tmp_path / "w"
    assert tool("setup", "--workdir", str(work)).returncode == 0
    nobody = f"http://127.0.0.1:{free_port()}"
    label = tool("label", "--workdir", str(work), "--bot", nobody)
    assert label.returncode == 3 and label.stdout == ""
    assert label.stderr == f"error: no bot at {nobody}: start `fusebot serve` or pass --bot URL (ConnectError)\n"
    shown = tool("show", "--workdir", str(work))  # `serve` was never started
    assert shown.returncode == 3 and shown.stderr.startswith("error: no GitHub at http://127.0.0.1:")
    assert "Traceback" not in label.stderr + shown.stderr
