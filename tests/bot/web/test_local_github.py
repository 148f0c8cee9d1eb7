"""tests/fakes/local_github.py, the README's "Trying the App on one machine": `setup`, `serve`, a real `fusebot serve`
on the settings it wrote, and `label` sending the signed webhook. The delivery becomes a queued job after the bot's
real requests to the fake GitHub (token, config, permission, changed files, check run). Then the conversation:
`comment "/fusebot status"` is answered (and reacted to), and `show` reads back the comments and check runs. The
worker's half of the loop (lease, search, result, PR) is tests/bot/test_worker.py's and test_action_search.py's.
A restarted fake GitHub keeps what was written to it, with GitHub's real times."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import httpx
import jwt
import pytest

from tests.bot.helpers import APP_ID, INSTALLATION, REPO, GitRepo, rsa_keys
from tests.fakes.github_server import FakeGitHub
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


GITHUB_TIME = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ"


def parse(stamp: str) -> datetime:
    assert re.fullmatch(GITHUB_TIME, stamp), stamp
    return datetime.fromisoformat(stamp.replace("Z", "+00:00"))


def test_a_restarted_local_github_keeps_the_comments_with_their_times(tmp_path: Path, procs: list[subprocess.Popen]):
    work = tmp_path / "w"
    assert tool("setup", "--workdir", str(work)).returncode == 0
    api = read_env(work / "env.sh")["FUSEBOT_GITHUB_API_URL"]

    def serve(log_name: str) -> subprocess.Popen:
        log = tmp_path / log_name
        proc = subprocess.Popen([sys.executable, "-m", "tests.fakes.local_github", "serve", "--workdir", str(work)],
                                cwd=ROOT, stdout=log.open("w"), stderr=subprocess.STDOUT)
        procs.append(proc)
        wait_for(f"{api}/repos/{REPO}", proc, log)
        return proc

    before = datetime.now(UTC).replace(microsecond=0)
    first = serve("github-1.log")
    nobody = f"http://127.0.0.1:{free_port()}"
    for text in ("/fusebot status", "/fusebot help"):  # no bot: the comment is on GitHub all the same
        assert tool("comment", "--workdir", str(work), "--bot", nobody, text).returncode == 3
    first.terminate()
    assert first.wait(20) is not None
    serve("github-2.log")
    shown = tool("show", "--workdir", str(work))
    assert shown.returncode == 0, shown.stderr
    times = [parse(t) for t in re.findall(r"^## maintainer at (\S+)$", shown.stdout, re.M)]
    assert len(times) == 2 and shown.stdout.index("/fusebot status") < shown.stdout.index("/fusebot help")
    assert before <= times[0] <= times[1] <= datetime.now(UTC)


def test_the_fake_keeps_pull_requests_comments_and_check_runs_across_a_restart(tmp_path: Path):
    """What the App writes, with GitHub's real times (created before updated, each between the test's start and
    end), read back through the API from a new fake on the same state file, with the same installation token."""
    state = tmp_path / "github-state.json"
    repo = GitRepo.create(tmp_path / "git", REPO)
    main = repo.commit({"README.md": "x\n"}, "initial")
    repo.commit({"k.cu": "// kernel\n"}, "a kernel", branch="fusebot/main/k")

    def started() -> FakeGitHub:
        fake = FakeGitHub(APP_ID, rsa_keys()[1], tmp_path / "git", state_file=state)
        fake.add_repo(REPO, INSTALLATION, repo.bare)
        return fake

    before = datetime.now(UTC).replace(microsecond=0)
    fake = started()
    with fake.running() as url:
        now = int(time.time())
        app_jwt = jwt.encode({"iss": str(APP_ID), "iat": now - 30, "exp": now + 500}, rsa_keys()[0], "RS256")
        got = httpx.post(f"{url}/app/installations/{INSTALLATION}/access_tokens",
                         headers={"Authorization": f"Bearer {app_jwt}"})
        token = got.json()["token"]
        gh = httpx.Client(base_url=url, headers={"Authorization": f"token {token}"})
        run = gh.post(f"/repos/{REPO}/check-runs", json={"name": "fusebot", "head_sha": main, "status": "queued",
                                                        "output": {"title": "Queued", "summary": "waiting"}}).json()
        time.sleep(1.1)  # GitHub's times have whole seconds: the update is a later one
        gh.patch(f"/repos/{REPO}/check-runs/{run['id']}", json={"conclusion": "success",
                                                                 "output": {"title": "Done", "summary": "ok"}})
        pull = gh.post(f"/repos/{REPO}/pulls", json={"title": "A kernel", "head": "fusebot/main/k", "base": "main",
                                                     "body": "first"}).json()
        comment = gh.post(f"/repos/{REPO}/issues/{pull['number']}/comments", json={"body": "first"}).json()
        time.sleep(1.1)
        gh.patch(f"/repos/{REPO}/pulls/{pull['number']}", json={"body": "second"})
        gh.patch(f"/repos/{REPO}/issues/comments/{comment['id']}", json={"body": "second"})
    assert fake.errors == []
    after = datetime.now(UTC)

    again = started()
    with again.running() as url:
        gh = httpx.Client(base_url=url, headers={"Authorization": f"token {token}"})
        [kept_run] = gh.get(f"/repos/{REPO}/commits/{main}/check-runs").json()["check_runs"]
        kept_pull = gh.get(f"/repos/{REPO}/pulls/{pull['number']}").json()
        [kept_comment] = gh.get(f"/repos/{REPO}/issues/{pull['number']}/comments").json()
        new = gh.post(f"/repos/{REPO}/issues/{pull['number']}/comments", json={"body": "after the restart"}).json()
    assert again.errors == []
    assert (kept_run["id"], kept_run["status"], kept_run["conclusion"]) == (run["id"], "completed", "success")
    assert kept_run["output"]["title"] == "Done"
    assert before <= parse(kept_run["started_at"]) < parse(kept_run["completed_at"]) <= after
    assert (kept_pull["title"], kept_pull["body"]) == ("A kernel", "second")
    assert before <= parse(kept_pull["created_at"]) < parse(kept_pull["updated_at"]) <= after
    assert (kept_comment["id"], kept_comment["body"]) == (comment["id"], "second")
    assert before <= parse(kept_comment["created_at"]) < parse(kept_comment["updated_at"]) <= after
    assert new["id"] > max(run["id"], comment["id"])  # ids go on from where they were
    assert parse(kept_comment["created_at"]) <= parse(new["created_at"])
