import os
import time

from typer.testing import CliRunner

from runner.cli.worker import Worker, WorkerSettings, app
from runner.harness import bwrap


def test_the_poll_loop_touches_the_alive_file_even_when_the_bot_is_down(tmp_path):
    alive = tmp_path / "state" / "alive"
    settings = WorkerSettings(bot_url="http://127.0.0.1:9", token="t" * 32, alive_file=alive, poll_seconds=0.1)
    before = time.time()
    Worker(settings).run(once=True)  # the bot is unreachable: one poll, then out
    assert alive.exists() and os.path.getmtime(alive) >= before - 1


def test_a_job_this_runner_cannot_read_is_failed_with_the_reason_not_run(tmp_path):
    """A job from a newer bot (here a kind this runner does not know) fails clearly; the worker lives on."""
    import json

    import httpx

    calls = []

    def bot(request: httpx.Request) -> httpx.Response:
        calls.append((request.method, request.url.path, request.headers.get("X-Fusebot-Lease"), request.content))
        if request.url.path == "/runner/v1/lease":
            if len(calls) > 1:
                return httpx.Response(204)
            job = {"schema_version": 1, "id": "j9", "repo": "o/r", "sha": "0" * 40, "targets": [], "kind": "teleport"}
            return httpx.Response(200, json={"job": job, "lease_token": "lease-1", "lease_ttl_seconds": 30})
        return httpx.Response(200, json={"recorded": True})

    settings = WorkerSettings(bot_url="http://bot.test", token="t" * 32, poll_seconds=0.01)
    ran = []
    worker = Worker(settings, run_job=lambda *a: ran.append(a), client=httpx.Client(
        base_url="http://bot.test", transport=httpx.MockTransport(bot)))
    assert worker.run(once=True) == 1 and ran == []
    [fail] = [c for c in calls if c[1] == "/runner/v1/jobs/j9/fail"]
    assert fail[2] == "lease-1" and "could not read this job" in json.loads(fail[3])["error"]
    assert "teleport" in json.loads(fail[3])["error"]


def test_the_worker_refuses_to_start_without_a_sandbox_unless_told_to(tmp_path, monkeypatch, caplog):
    """No job is leased where untrusted code could not be confined; a misspelt opt-out is a usage error."""
    monkeypatch.setenv("FUSEBOT_WORKER_TOKEN", "t" * 32)
    monkeypatch.setenv("FUSEBOT_WORKER_BOT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap on it
    bwrap._mode.cache_clear()
    try:
        monkeypatch.delenv(bwrap.UNSAFE_ENV, raising=False)
        result = CliRunner().invoke(app, ["--once"])
        assert result.exit_code == 3 and "apt-get install bubblewrap" in caplog.text
        monkeypatch.setenv(bwrap.UNSAFE_ENV, "true")
        assert CliRunner().invoke(app, ["--once"]).exit_code == 2
    finally:
        bwrap._mode.cache_clear()
