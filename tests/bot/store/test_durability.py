"""A bot killed with SIGKILL and restarted on the same SQLite file loses nothing and runs nothing twice."""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Iterator

import httpx
import pytest

from bot.store.db import init_db
from bot.store.store import Store
from runner.cli.worker import Worker, WorkerSettings
from runner.contract import JobResult, Progress
from tests.bot.botproc import BotProcess
from tests.bot.helpers import (
    INSTALLATION,
    REPO,
    RUNNER_TOKENS,
    WEBHOOK_SECRET,
    GitRepo,
    initial_files,
    pr_payload,
    rsa_keys,
    signed_headers,
)
from tests.fakes.github_server import FakeGitHub, Pull


@pytest.fixture
def setup(tmp_path, fake_github: FakeGitHub) -> Iterator[tuple[BotProcess, FakeGitHub, dict[str, str]]]:
    repo = GitRepo.create(fake_github.git_root, REPO)
    main = repo.commit(initial_files(), "initial")
    feature = repo.commit({"models/attn.py": initial_files()["models/attn.py"] + "\n# x\n"}, "f", branch="feature")
    fake_github.add_repo(REPO, INSTALLATION, repo.bare)
    fake_github.add_pull(Pull(REPO, 2, feature, "feature", REPO, "main", main))
    fake_github.set_permission(REPO, "maintainer", "write")
    bot = BotProcess(tmp_path, fake_github.base_url, fake_github.clone_url_template(),
                     FUSEBOT_LEASE_TTL_SECONDS="30", FUSEBOT_DELIVERY_CLAIM_SECONDS="2")
    bot.start()
    try:
        yield bot, fake_github, {"main": main, "feature": feature}
    finally:
        bot.stop()
    # no secret ever reaches the log: webhook secret, App key, runner tokens, installation tokens
    log = bot.log()
    assert "fusebot serve on" in log and "background loop started" in log  # the check below means something
    for secret in [WEBHOOK_SECRET, *RUNNER_TOKENS.values(), *fake_github.tokens]:
        assert secret not in log
    assert rsa_keys()[0].splitlines()[1] not in log


def post(bot: BotProcess, payload: dict, delivery: str) -> httpx.Response:
    body = json.dumps(payload).encode()
    return httpx.post(f"{bot.url}/webhook", content=body, headers=signed_headers("pull_request", body, delivery))


def wait_for(predicate, timeout_s: float = 30.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def test_bot_killed_mid_job_and_mid_inbox(setup, tmp_path):
    bot, fake, sha = setup
    store = Store(init_db(bot.env["DATABASE_URL"]))
    label = pr_payload("labeled", number=2, head_sha=sha["feature"], base_sha=sha["main"], label="optimize-kernels")
    assert post(bot, label, "first").status_code == 202
    wait_for(lambda: len(store.list_jobs()) == 1, what="the first job")

    # a worker takes the job; its search is still running when the bot dies
    finish, started, ran = threading.Event(), threading.Event(), []

    def run_job(job, source_dir, progress):
        started.set()
        ran.append(job.id)
        while not finish.wait(0.05):
            progress(Progress(round=1))
        return JobResult(job_id=job.id, ok=True)

    worker = Worker(WorkerSettings(bot_url=bot.url, token=RUNNER_TOKENS["gpu-a"], heartbeat_seconds=0.2,
                                   upload_retry_seconds=60), run_job=run_job)
    t = threading.Thread(target=worker.run_one)
    t.start()
    assert started.wait(20)

    # a burst of deliveries, then SIGKILL before the bot can have handled them all (GitHub is slow today)
    fake.latency_s = 0.1
    for i in range(20):
        assert post(bot, label, f"burst-{i}").status_code == 202
    bot.kill()
    handled_before = len(store.list_jobs())
    fake.latency_s = 0.0
    finish.set()  # the search ends while the bot is down: the upload must wait and retry
    time.sleep(0.5)
    bot.start()
    t.join(60)
    assert not t.is_alive()

    wait_for(lambda: store.delivery_counts() == {"done": 21}, what="every delivery handled after the restart")
    jobs = store.list_jobs()
    assert handled_before < 21, "the kill came too late to test the inbox"
    assert len(jobs) == 21  # nothing lost, nothing recorded twice
    first = store.get(ran[0])
    assert ran == [first.id] and first.state == "succeeded" and first.attempts == 1  # not run twice
    assert {j.state for j in jobs if j.id != first.id} == {"queued"}
    # replaying a delivery after the restart still dedupes (the dedupe table is on disk)
    assert post(bot, label, "burst-3").json() == {"queued": False, "duplicate": True}
    # the job's check run is completed by the restarted bot (the stub found nothing faster: neutral)
    wait_for(lambda: fake.check_runs[store.get(first.id).check_run_id].get("conclusion") == "neutral",
             what="the finished job's check run")


def test_healthz_reports_a_dead_background_worker(setup):
    import os
    import signal

    import psutil

    bot, _fake, _sha = setup
    wait_for(lambda: "background loop started" in bot.log(), what="the background process")
    assert httpx.get(f"{bot.url}/healthz").json() == {"ok": True}
    [child] = [c for c in psutil.Process(bot.proc.pid).children()
               if "resource_tracker" not in " ".join(c.cmdline())]  # the background loop process
    os.kill(child.pid, signal.SIGKILL)
    wait_for(lambda: httpx.get(f"{bot.url}/healthz").status_code == 503, what="healthz to notice")
    assert "background" in httpx.get(f"{bot.url}/healthz").json()["error"]
