"""`fusebot worker` on SIGTERM (runner/cli/worker.py `serve`, in a real process against a real bot): it leases
nothing more, and its unit either finishes within `drain_seconds` or goes back to the queue at once, so another worker
takes it without waiting for the lease to expire. Its readiness file is there while it takes work, gone once it
drains."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from bot.web.server import create_app
from runner.cli.worker import Worker, WorkerSettings
from runner.contract import JobResult, TargetResult
from tests.bot.conftest import fake_github, make_world  # noqa: F401 (fake_github: a fixture used here)
from tests.bot.helpers import REPO, RUNNER_TOKENS, comment_payload
from tests.fakes.serve import serve_in_thread

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def bot(tmp_path, fake_github) -> Iterator[tuple]:  # noqa: F811
    """A bot on loopback whose leases last 300 s (an expiry cannot explain a re-lease), holding one job of two
    targets (`/fusebot run all` on PR 2): two units."""
    world = make_world(tmp_path, fake_github, lease_ttl_seconds=300)
    app = create_app(world.settings, ctx=world.ctx, background=True)
    with serve_in_thread(app) as url:
        world.fake.add_comment(REPO, 2, 900, "/fusebot run all", "maintainer")
        world.post("issue_comment", comment_payload("/fusebot run all", number=2, comment_id=900))
        deadline = time.monotonic() + 20
        while not world.jobs() and time.monotonic() < deadline:
            time.sleep(0.05)
        [job] = world.jobs()
        yield world, url, job


def spawn(url: str, mode: str, drain_s: float, ready: Path, **env_extra: str) -> subprocess.Popen:
    env = {**os.environ, "FUSEBOT_WORKER_TOKEN": RUNNER_TOKENS["gpu-a"], "PYTHONPATH": str(ROOT), **env_extra}
    return subprocess.Popen([sys.executable, "-m", "tests.runner.cli.drain_worker", url, mode, str(drain_s),
                             str(ready)], cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def read_until(proc: subprocess.Popen, marker: str, timeout_s: float = 30) -> str:
    out: list[str] = []
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        out.append(line)
        if marker in line:
            return line
    raise AssertionError(f"{marker!r} not seen; output:\n{''.join(out)}")


def other_worker(url: str, **settings_extra) -> tuple[Worker, list[str]]:
    ran: list[str] = []

    def run_job(job, source_dir, progress):
        ran.append(job.id)
        return JobResult(job_id=job.id, ok=True, targets=[TargetResult(target=t.name, improved=False)
                                                          for t in job.targets])

    settings = WorkerSettings(bot_url=url, token=RUNNER_TOKENS["gpu-b"], poll_seconds=0.05, heartbeat_seconds=0.2,
                              **settings_extra)
    return Worker(settings, run_job=run_job), ran


def test_sigterm_releases_the_unit_and_another_worker_takes_it_at_once(bot, tmp_path):
    world, url, job = bot
    ready = tmp_path / "ready"
    proc = spawn(url, "block", 0, ready)
    try:
        unit_id = read_until(proc, "RUNNING").split()[1]
        assert ready.exists()  # it reached the bot and takes work
        proc.send_signal(signal.SIGTERM)
        read_until(proc, "GAVE BACK", timeout_s=15)
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    assert not ready.exists()
    unit = world.ctx.store.unit(unit_id)
    assert unit.state == "queued" and unit.attempts == 1 and unit.leased_by is None
    worker, ran = other_worker(url)
    started = time.monotonic()
    assert worker.run(once=True) == 2 and ran[0] == unit_id  # the given-back unit first, no TTL wait
    assert time.monotonic() - started < 30 and world.ctx.store.get(job.id).state == "succeeded"


def test_sigterm_lets_the_unit_finish_within_the_drain_time(bot, tmp_path):
    world, url, job = bot
    proc = spawn(url, "slow", 20, tmp_path / "ready")
    try:
        unit_id = read_until(proc, "RUNNING").split()[1]
        proc.send_signal(signal.SIGTERM)
        assert "DONE 1" in read_until(proc, "DONE", timeout_s=20)  # finished its unit, took no other
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    units = {u.id: u for u in world.ctx.store.units(job.id)}
    assert units[unit_id].state == "succeeded" and units[unit_id].result.targets[0].message == "drained"
    assert [u.state for u in units.values() if u.id != unit_id] == ["queued"]


def test_sigterm_gives_the_unit_back_when_the_drain_time_is_up(bot, tmp_path):
    world, url, _ = bot
    proc = spawn(url, "block", 1, tmp_path / "ready")
    try:
        unit_id = read_until(proc, "RUNNING").split()[1]
        t0 = time.monotonic()
        proc.send_signal(signal.SIGTERM)
        read_until(proc, "GAVE BACK", timeout_s=15)
        assert time.monotonic() - t0 >= 0.9
        assert proc.wait(15) == 0
    finally:
        proc.kill()
    assert world.ctx.store.unit(unit_id).state == "queued"


def test_a_worker_killed_mid_unit_hands_it_back_when_it_starts_again(bot, tmp_path):
    world, url, job = bot
    lease_file = tmp_path / "state" / "lease.json"
    proc = spawn(url, "block", 0, tmp_path / "ready", FUSEBOT_WORKER_LEASE_FILE=str(lease_file))
    try:
        unit_id = read_until(proc, "RUNNING").split()[1]
    finally:
        proc.kill()  # SIGKILL: no drain, no release
    proc.wait(15)
    assert world.ctx.store.unit(unit_id).state in ("leased", "running") and lease_file.exists()
    restarted, ran = other_worker(url, lease_file=lease_file)  # the same worker, started again
    started = time.monotonic()
    assert restarted.run(once=True) == 2 and ran[0] == unit_id  # handed back at once, not after the 300 s lease
    assert time.monotonic() - started < 30 and world.ctx.store.get(job.id).state == "succeeded"
    assert not lease_file.exists()
