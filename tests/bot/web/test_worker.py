"""End to end: webhooks into a running bot (real HTTP on loopback), jobs out to runner/cli/worker.py workers.

A labelled-PR webhook, a comment command and a nightly tick each become exactly one job that a worker leases,
downloads, runs (a stub run_job) and completes, with the check run completed on the fake GitHub. Then the
failure paths: no run_job installed, a cancelled job, a worker killed mid-job (its lease expires and another worker
finishes the job), a worker stopped with SIGTERM (the job goes straight back to the queue).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path

import httpx
import pytest

from bot.store.db import utcnow
from bot.web.server import create_app
from runner.cli.worker import JobStopped, Worker, WorkerSettings
from runner.contract import Job, JobResult, Progress, TargetResult
from tests.bot.conftest import World, make_world, new_postgres_db
from tests.bot.helpers import (
    REPO,
    RUNNER_TOKENS,
    WEBHOOK_SECRET,
    comment_payload,
    pr_payload,
    rsa_keys,
    signed_headers,
)
from tests.fakes.serve import serve_in_thread

ROOT = Path(__file__).resolve().parents[3]


@dataclass
class Live:
    world: World
    url: str

    def worker(self, run_job, runner: str = "gpu-a", **kw) -> Worker:
        settings = WorkerSettings(bot_url=self.url, token=RUNNER_TOKENS[runner], poll_seconds=0.05,
                                  heartbeat_seconds=kw.pop("heartbeat_seconds", 0.2), upload_retry_seconds=20, **kw)
        return Worker(settings, run_job=run_job)


@pytest.fixture(params=["sqlite", "postgresql"])
def live(request, tmp_path, fake_github) -> Iterator[Live]:
    """The bot serving on loopback with its background thread, on SQLite or a real PostgreSQL server."""
    db = {}
    if request.param == "postgresql":
        db["database_url"] = new_postgres_db(request.getfixturevalue("postgres_server"))
    world = make_world(tmp_path, fake_github, scheduler_interval_seconds=0.1, lease_ttl_seconds=3, **db)
    app = create_app(world.settings, ctx=world.ctx, background=True)
    with serve_in_thread(app) as url:
        yield Live(world, url)


def wait_for(predicate, timeout_s: float = 20.0, what: str = "condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def quiet(live: Live) -> bool:
    """Every delivery handled and every check run up to date."""
    counts = live.world.ctx.store.delivery_counts()
    return set(counts) <= {"done", "failed"} and not live.world.ctx.store.unnotified()


class StubSearch:
    def __init__(self) -> None:
        self.ran: list[str] = []
        self.lock = threading.Lock()

    def __call__(self, job: Job, source_dir: Path, progress) -> JobResult:
        assert (source_dir / "models" / "attn.py").is_file() and not (source_dir / ".git").exists()
        progress(Progress(round=1, built=2, verified=1, best_speedup=1.7))
        with self.lock:
            self.ran.append(job.id)
        return JobResult(job_id=job.id, ok=True, targets=[
            TargetResult(target=t.name, improved=True, message="1.70x faster than torch.compile",
                         files={f"{t.name}/kernel.cu": f"// {t.name}: stub kernel\n"}, class_name=t.class_name)
            for t in job.targets])


def test_label_comment_and_nightly_each_become_one_completed_job(live, caplog):
    caplog.set_level(logging.DEBUG)  # PyGithub, urllib3, httpx and fusebot all log at DEBUG here
    w, sha = live.world, live.world.shas
    leases: list[str] = []

    def post(event, payload):  # over real HTTP to the running server
        body = json.dumps(payload).encode()
        return httpx.post(f"{live.url}/webhook", content=body, headers=signed_headers(event, body))

    assert post("pull_request", pr_payload("labeled", number=2, head_sha=sha["feature"], base_sha=sha["main"],
                                           label="optimize-kernels")).status_code == 202
    w.fake.add_comment(REPO, 2, 900, "/fusebot run all", "maintainer")
    assert post("issue_comment", comment_payload("/fusebot run all", number=2, comment_id=900)).status_code == 202
    # the nightly slot comes due: the background thread's scheduler tick queues it
    w.ctx.store.set_schedule(REPO, enabled=True, cron="0 3 * * *", timezone="UTC",
                             next_run_at=utcnow() - timedelta(minutes=1))
    wait_for(lambda: len(w.jobs()) == 3 and quiet(live), what="three jobs")

    search = StubSearch()
    worker = live.worker(search)
    lease = worker.lease
    worker.lease = lambda: (got := lease()) and (leases.append(got["lease_token"]) or got)  # type: ignore[method-assign]
    assert worker.run(once=True) == 5  # `run all` and the nightly run: two targets each, two units each
    assert live.worker(search, runner="gpu-b").run(once=True) == 0  # nothing left: nothing runs twice

    jobs = w.jobs()
    assert sorted(j.trigger for j in jobs) == ["comment", "label", "schedule"]
    assert sorted(search.ran) == sorted(u.id for j in jobs for u in w.ctx.store.units(j.id))
    assert {j.state for j in jobs} == {"succeeded"}
    nightly = next(j for j in jobs if j.trigger == "schedule")
    assert nightly.sha == sha["main"] and nightly.pr_number is None and len(nightly.spec.targets) == 2
    assert [j.result.targets[0].message for j in jobs] == ["1.70x faster than torch.compile"] * 3
    assert [t.target for t in nightly.result.targets] == [t.name for t in nightly.spec.targets]  # gathered in order
    wait_for(lambda: quiet(live), what="check runs")
    runs = [r for r in w.fake.check_runs.values() if r["name"] == "fusebot"]
    assert len(runs) == 3 and {r["conclusion"] for r in runs} == {"success"}
    assert {r["head_sha"] for r in runs} == {sha["feature"], sha["main"]}
    # PRs: one per base branch and target, the label's and the comment's job on PR 2 updating the same ones
    bot_pulls = [pr for pr in w.fake.pulls.values() if pr.user == "fusebot[bot]"]
    targets = sorted(t.name for t in nightly.spec.targets)
    assert sorted((pr.base_ref, pr.head_ref) for pr in bot_pulls) == sorted(
        [(base, f"fusebot/{base}/{t.lower()}") for base in ("feature", "main") for t in targets])
    assert all(pr.body and "<!-- fusebot:pr key=" in pr.body for pr in bot_pulls)
    [status] = [c for c in w.fake.comments_on(REPO, 2) if "fusebot:status" in c]
    assert "https://github.com/" in status
    # the next nightly slot is tomorrow, from the default branch's config (default: daily 03:00 UTC)
    [repo] = w.ctx.store.repos()
    assert repo.next_run_at is not None and repo.next_run_at > utcnow()

    # no secret in any log line: webhook secret, App key, runner tokens, installation tokens, lease tokens
    text = "\n".join(f"{r.getMessage()} {r.exc_text or ''}" for r in caplog.records)
    assert "POST /app/installations/1/access_tokens" in text and len(caplog.records) > 50  # the logs were there
    assert len(leases) == 5 and w.fake.tokens
    for secret in [WEBHOOK_SECRET, *RUNNER_TOKENS.values(), *w.fake.tokens, *leases]:
        assert secret not in text
    for line in rsa_keys()[0].splitlines()[1:-1]:
        assert line not in text


def test_missing_run_job_fails_the_job_clearly(live, monkeypatch):
    monkeypatch.setitem(sys.modules, "runner.pipeline", None)  # as if the search were not installed
    w = live.world
    w.post("pull_request", pr_payload("labeled", number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"],
                                      label="optimize-kernels"))
    wait_for(lambda: w.jobs(), what="a job")
    assert live.worker(None).run(once=True) == 1
    [job] = w.jobs()
    assert job.state == "failed" and "runner.pipeline.run_job is not available" in job.error


def test_cancelled_job_stops_the_worker(live):
    w = live.world
    w.post("pull_request", pr_payload("labeled", number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"],
                                      label="optimize-kernels"))
    wait_for(lambda: w.jobs(), what="a job")
    stopped, started = threading.Event(), threading.Event()

    def run_job(job, source_dir, progress):
        started.set()
        try:
            while True:
                progress(Progress(round=1))
                time.sleep(0.05)
        except JobStopped:
            stopped.set()
            raise

    t = threading.Thread(target=live.worker(run_job).run, kwargs={"once": True})
    t.start()
    wait_for(started.is_set, what="run_job to start")
    w.ctx.store.cancel(REPO, pr_number=2)
    t.join(15)
    assert not t.is_alive() and stopped.is_set()
    assert w.jobs()[0].state == "cancelled"


def spawn_worker(url: str, mode: str, runner: str = "gpu-a") -> subprocess.Popen:
    env = {**os.environ, "FUSEBOT_WORKER_TOKEN": RUNNER_TOKENS[runner], "PYTHONPATH": str(ROOT)}
    return subprocess.Popen([sys.executable, "-m", "tests.bot.stub_worker", url, mode], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc: subprocess.Popen, marker: str, timeout_s: float = 30) -> str:
    out = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if marker in line:
            return "".join(out)
    raise AssertionError(f"{marker!r} not seen; output:\n{''.join(out)}")


def test_worker_killed_mid_job_another_finishes(live):
    w = live.world
    w.post("pull_request", pr_payload("labeled", number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"],
                                      label="optimize-kernels"))
    wait_for(lambda: w.jobs(), what="a job")
    proc = spawn_worker(live.url, "block")
    try:
        read_until(proc, "RUNNING")
        wait_for(lambda: w.jobs()[0].state == "running", what="running")
    finally:
        proc.kill()  # SIGKILL: no goodbye, the lease just stops being renewed
        proc.wait(10)
    search = StubSearch()
    second = live.worker(search, runner="gpu-b")
    assert second.run(once=True) == 0  # the lease (3 s) has not expired yet
    wait_for(lambda: second.run(once=True) == 1, timeout_s=15, what="the expired lease to be re-leased")
    [job] = w.jobs()
    assert job.state == "succeeded" and job.attempts == 2 and search.ran == [job.id]


def test_sigterm_gives_the_job_back(live):
    w = live.world
    w.post("pull_request", pr_payload("labeled", number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"],
                                      label="optimize-kernels"))
    wait_for(lambda: w.jobs(), what="a job")
    proc = spawn_worker(live.url, "block")
    try:
        read_until(proc, "RUNNING")
        proc.send_signal(signal.SIGTERM)
        read_until(proc, "RELEASED", timeout_s=15)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    [job] = w.jobs()
    assert job.state == "queued" and job.attempts == 1  # back in the queue at once, no TTL wait


@pytest.mark.parametrize("token, url", [("changeme", "http://bot"), ("abc123xyz", "http://bot"),
                                        ("runner-a-token-0123456789", "ftp://bot")])
def test_worker_settings_refuse_unsafe_values(token, url):
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as e:
        WorkerSettings(bot_url=url, token=token)
    assert token not in str(e.value)


def test_worker_command_exits_without_a_token(monkeypatch):
    from typer.testing import CliRunner

    from runner.cli.worker import app

    monkeypatch.delenv("FUSEBOT_WORKER_TOKEN", raising=False)
    result = CliRunner().invoke(app, ["--bot", "http://127.0.0.1:1", "--once"])
    assert result.exit_code == 2 and "FUSEBOT_WORKER_TOKEN is not set" in result.output, result.output


@pytest.mark.parametrize("live", ["sqlite"], indirect=True)
def test_worker_command_pins_its_gpu_and_runs_the_default_run_job(live, monkeypatch):
    """`fusebot worker --bot URL --gpu 1`: the job runs with CUDA_VISIBLE_DEVICES=1 (one worker per GPU)."""
    from typer.testing import CliRunner

    import runner.cli.worker as worker_module

    w = live.world
    w.post("pull_request", pr_payload("labeled", number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"],
                                      label="optimize-kernels"))
    wait_for(lambda: w.jobs(), what="a job")
    seen: dict[str, str | None] = {}

    def run_job(job, source_dir, progress):
        seen["gpu"] = os.environ.get("CUDA_VISIBLE_DEVICES")
        return JobResult(job_id=job.id, ok=True)

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "unset-by-test")  # restored after the test
    monkeypatch.setenv("FUSEBOT_WORKER_TOKEN", RUNNER_TOKENS["gpu-b"])
    monkeypatch.setattr(worker_module, "default_run_job", lambda: run_job)
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(worker_module.app, ["--bot", live.url, "--gpu", "1", "--once"])
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 0, result.output
    assert seen == {"gpu": "1"} and w.jobs()[0].state == "succeeded"


@pytest.mark.parametrize("live", ["sqlite"], indirect=True)
def test_worker_with_a_wrong_token_stops_at_once(live, monkeypatch, caplog):
    from typer.testing import CliRunner

    from runner.cli.worker import TokenRefused, app

    settings = WorkerSettings(bot_url=live.url, token="not-a-runner-token-0123456789")
    with pytest.raises(TokenRefused):
        Worker(settings, run_job=StubSearch()).run()
    monkeypatch.setenv("FUSEBOT_WORKER_TOKEN", "not-a-runner-token-0123456789")
    previous = signal.getsignal(signal.SIGTERM)
    try:
        result = CliRunner().invoke(app, ["--bot", live.url])  # no --once: it must not loop on a refused token
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert result.exit_code == 2 and "refused this runner's token" in caplog.text
    assert "not-a-runner-token-0123456789" not in caplog.text


def test_two_workers_work_one_jobs_targets_at_once_and_it_is_delivered_once(live):
    """`/fusebot run all` on PR 2: two targets, two units; two workers (two GPUs) each run one at the same time, and
    the job's one result is delivered once: one PR per target (the default grouping), one check run, one status."""
    w = live.world
    w.fake.add_comment(REPO, 2, 901, "/fusebot run all", "maintainer")
    w.post("issue_comment", comment_payload("/fusebot run all", number=2, comment_id=901))
    [job] = wait_for(lambda: w.jobs(), what="a job")
    both = threading.Barrier(2, timeout=15)  # each unit waits for the other to be running: they overlap
    search = StubSearch()

    def run_job(job, source_dir, progress):
        both.wait()
        return search(job, source_dir, progress)

    workers = [live.worker(run_job, runner=r) for r in ("gpu-a", "gpu-b")]
    threads = [threading.Thread(target=x.run, kwargs={"max_jobs": 1}) for x in workers]
    for t in threads:
        t.start()
    for t in threads:
        t.join(30)
    assert sorted(search.ran) == [f"{job.id}.0", f"{job.id}.1"]
    info = w.ctx.store.get(job.id)
    assert info.state == "succeeded" and [t.target for t in info.result.targets] == [t.name for t in job.spec.targets]
    assert {u.leased_by for u in w.ctx.store.units(job.id)} == {"gpu-a", "gpu-b"}
    wait_for(lambda: quiet(live), what="delivery")
    bot_pulls = [pr for pr in w.fake.pulls.values() if pr.user == "fusebot[bot]"]
    assert len(bot_pulls) == 2 == len({pr.head_ref for pr in bot_pulls})
    runs = [r for r in w.fake.check_runs.values() if r["external_id"] == job.id]
    assert len(runs) == 1 and runs[0]["conclusion"] == "success"
    assert len([c for c in w.fake.comments_on(REPO, 2) if "fusebot:status" in c]) == 1
