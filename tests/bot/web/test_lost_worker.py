"""A worker that stops answering mid-job, with the store's clock in the test's hands: `fusebot worker`s
(runner/cli/worker.py) against the bot's runner API, heart-beating on their own threads.

Worker A's heartbeats keep its job's lease for many lease lengths; then A goes silent (its heartbeats no longer
reach the bot, as when it is killed or its machine drops off the network). One lease length later the job is queued
again, and the check run and `/fusebot status` say which attempt comes and why; worker B takes it and finishes it.
When A's heartbeats get through again they are refused, and A stops its search without handing in a result.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import httpx
from starlette.testclient import TestClient

from runner.cli.worker import JobStopped, Worker, WorkerSettings
from runner.contract import Job, JobResult, Progress, TargetResult
from tests.bot.conftest import make_world
from tests.bot.helpers import REPO, RUNNER_TOKENS, comment_payload, pr_payload
from tests.bot.store.test_units import Clock
from tests.bot.web.test_worker import wait_for

LEASE_S = 60.0
NOTE = "attempt 2 of 3: the previous worker stopped answering (runner gpu-a)"


class Line(TestClient):
    """A worker's connection to the bot that the test can cut: while cut, heartbeats fail as an unreachable bot's
    would. Keeps the answers of the heartbeats that got through, and how many are on their way."""

    def __init__(self, app, runner: str) -> None:
        super().__init__(app, headers={"Authorization": f"Bearer {RUNNER_TOKENS[runner]}"})
        self.cut = threading.Event()
        self.answers: list[int] = []
        self.posted: list[str] = []
        self.in_flight = 0
        self._lock = threading.Lock()

    def post(self, url, **kw):  # type: ignore[override]
        beat = url.endswith("/heartbeat")
        with self._lock:
            if beat and self.cut.is_set():
                raise httpx.ConnectError("the bot is unreachable")
            self.in_flight += beat
        try:
            r = super().post(url, **kw)
        finally:
            with self._lock:
                self.in_flight -= beat
        self.posted.append(url.rsplit("/", 1)[-1])
        if beat:
            self.answers.append(r.status_code)
        return r


def worker(world, runner: str, run_job) -> tuple[Worker, Line]:
    line = Line(world.client.app, runner)
    settings = WorkerSettings(bot_url="http://testserver", token=RUNNER_TOKENS[runner], poll_seconds=0.05,
                              heartbeat_seconds=0.02, upload_retry_seconds=5)
    return Worker(settings, run_job=run_job, client=line), line


def beats_after(line: Line, n: int) -> bool:
    return len(line.answers) > n


def test_a_silent_workers_job_goes_to_another_and_the_pr_says_so(tmp_path: Path, fake_github):
    world = make_world(tmp_path, fake_github, lease_ttl_seconds=LEASE_S)
    clock = Clock()
    world.ctx.store.clock = clock
    with world.client:
        world.post("pull_request", pr_payload("labeled", number=2, head_sha=world.shas["feature"],
                                              base_sha=world.shas["main"], label="optimize-kernels"))
        world.drain()
        [job] = world.jobs()

        stopped = threading.Event()

        def search_until_stopped(job: Job, source_dir: Path, progress) -> JobResult:
            try:
                while True:
                    progress(Progress(round=1, built=1))
                    time.sleep(0.01)
            except JobStopped:
                stopped.set()
                raise

        a, line_a = worker(world, "gpu-a", search_until_stopped)
        thread_a = threading.Thread(target=a.run, kwargs={"once": True})
        thread_a.start()
        try:
            wait_for(lambda: world.ctx.store.get(job.id).state == "running", what="worker A running the job")

            # heartbeats keep the lease: ten lease lengths pass, each in steps shorter than one
            for _ in range(20):
                seen = len(line_a.answers)
                clock.advance(LEASE_S / 2)
                wait_for(lambda seen=seen: beats_after(line_a, seen + 1), what="a heartbeat after the clock moved")
                world.drain()
                assert world.ctx.store.get(job.id).state == "running"
            unit = world.ctx.store.unit(job.id)
            assert (unit.leased_by, unit.attempts, unit.retry_note) == ("gpu-a", 1, None)
            assert set(line_a.answers) == {200}

            # A goes silent: one lease length later its job is queued again, and the PR is told
            line_a.cut.set()
            wait_for(lambda: line_a.in_flight == 0, what="the last heartbeat through to arrive")
            clock.advance(LEASE_S + 1)
            world.drain()
            info = world.ctx.store.get(job.id)
            assert (info.state, info.attempts, info.retry_note) == ("queued", 1, NOTE)
            [run] = [r for r in world.fake.check_runs.values() if r["name"] == "fusebot"]
            assert run["status"] == "queued" and run["output"]["title"].startswith("Queued again")
            assert run["output"]["summary"].startswith("Attempt 2 of 3: the previous worker stopped answering "
                                                       "(runner gpu-a).\n\nWaiting for a GPU runner.")
            world.fake.add_comment(REPO, 2, 901, "/fusebot status", "maintainer")
            world.post("issue_comment", comment_payload("/fusebot status", number=2, comment_id=901))
            world.drain()
            [status] = [c for c in world.fake.comments_on(REPO, 2) if c.startswith("<!-- fusebot:status -->")]
            assert f"| queued, {NOTE} | 1 |" in status, status

            # B takes it: the check run shows the second attempt while B works
            release_b = threading.Event()

            def search_done(job: Job, source_dir: Path, progress) -> JobResult:
                progress(Progress(round=1, built=2, verified=1))
                assert release_b.wait(30)
                return JobResult(job_id=job.id, ok=True, targets=[
                    TargetResult(target=t.name, improved=False, message="nothing faster") for t in job.targets])

            b, line_b = worker(world, "gpu-b", search_done)
            thread_b = threading.Thread(target=b.run, kwargs={"once": True})
            thread_b.start()
            wait_for(lambda: world.ctx.store.get(job.id).state == "running", what="worker B running the job")
            world.drain()
            info = world.ctx.store.get(job.id)
            assert (info.attempts, info.retry_note, world.ctx.store.unit(job.id).leased_by) == (2, NOTE, "gpu-b")
            run = world.fake.check_runs[run["id"]]
            assert run["status"] == "in_progress" and run["output"]["summary"].startswith(
                "Attempt 2 of 3: the previous worker stopped answering (runner gpu-a).")

            # A's heartbeats get through again: refused, and A stops its search without a result
            line_a.cut.clear()
            thread_a.join(30)
            assert not thread_a.is_alive() and stopped.is_set()
            assert 409 in line_a.answers and "result" not in line_a.posted and "fail" not in line_a.posted

            release_b.set()
            thread_b.join(30)
            assert not thread_b.is_alive() and set(line_b.answers) == {200} and "result" in line_b.posted
        finally:
            line_a.cut.clear()
            a.stop.set()
            thread_a.join(30)
        world.drain()
        info = world.ctx.store.get(job.id)
        assert (info.state, info.attempts) == ("succeeded", 2)
        assert world.fake.check_runs[run["id"]]["status"] == "completed"
