"""`/fusebot stop` on a PR whose search a worker is running (a real bot on loopback, the worker in this process, the
real pipeline with a fake harness whose evaluation never ends by itself): the worker's heartbeat hears the cancel, the
chunk in evaluation is aborted, no proposer call or candidate starts after it, and the worker is free again. How soon
is the heartbeat's interval (2 s by default) plus the cut-off's poll and grace (runner/search/cutoff.py)."""

from __future__ import annotations

import contextlib
import threading
import time

from runner import pipeline
from runner.cli.worker import Worker, WorkerSettings
from tests.bot.conftest import fake_github  # noqa: F401 (a fixture used here)
from tests.bot.helpers import REPO, RUNNER_TOKENS, comment_payload
from tests.fakes.evaluators import PipelineTable
from tests.runner.cli.test_worker import bot  # noqa: F401 (a fixture used here)
from tests.runner.search.test_loop import Scripted


class Endless(PipelineTable):
    def __init__(self) -> None:
        super().__init__()
        self.evaluating, self.aborted = threading.Event(), threading.Event()
        self.started = 0

    def evaluate_many(self, candidates):
        self.started += 1
        self.evaluating.set()
        self.aborted.wait(60)
        return []

    def abort(self) -> None:
        self.aborted.set()


def test_fusebot_stop_aborts_the_evaluation_in_flight_and_frees_the_worker(bot, monkeypatch):  # noqa: F811
    world, url, job = bot
    ev = Endless()

    @contextlib.contextmanager
    def fake_evaluators(*args, **kwargs):
        yield ev

    monkeypatch.setattr(pipeline, "device_evaluators", fake_evaluators)
    proposer = Scripted("a", lambda r, k, j: "ms=1")

    def run_job(j, source_dir, progress):
        return pipeline.run_job(j, source_dir, progress, proposers=[proposer], backend="cpu")

    settings = WorkerSettings(bot_url=url, token=RUNNER_TOKENS["gpu-a"], poll_seconds=0.05, heartbeat_seconds=0.2)
    worker = Worker(settings, run_job=run_job)
    ran = threading.Thread(target=worker.run_one, daemon=True)
    ran.start()
    assert ev.evaluating.wait(60), "the search never started evaluating"
    calls_before = list(proposer.calls)
    world.fake.add_comment(REPO, 2, 901, "/fusebot stop", "maintainer")
    world.post("issue_comment", comment_payload("/fusebot stop", number=2, comment_id=901))
    waited = time.monotonic()
    while [j.state for j in world.jobs()] != ["cancelled"]:  # the bot handles the comment in the background
        assert time.monotonic() - waited < 30, [j.state for j in world.jobs()]
        time.sleep(0.05)
    assert ev.aborted.wait(30), "the evaluation in flight was never aborted"
    ran.join(30)
    assert not ran.is_alive(), "the worker is still busy with the cancelled job"
    assert ev.started == 1 and proposer.calls == calls_before  # nothing new started after the cancel
    time.sleep(0.3)  # a heartbeat more: still nothing
    assert ev.started == 1
