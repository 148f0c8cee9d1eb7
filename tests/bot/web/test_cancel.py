"""`/fusebot stop` (a cancelled job) stops a worker's real search at once: the heartbeat hears of it, the search's
deadline is cancelled, the chunk in evaluation is aborted, and no proposer call or evaluation starts after it.
A live bot on loopback, a `fusebot worker` running runner/pipeline.py's run_job with a fake harness whose evaluation
only ends when aborted."""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

import pytest

from bot.web.server import create_app
from runner.cli import worker as worker_cli
from runner.cli.worker import Worker, WorkerSettings
from runner.pipeline import run_job
from runner.search.cutoff import GRACE_S
from tests.bot.conftest import make_world
from tests.bot.helpers import REPO, RUNNER_TOKENS, pr_payload
from tests.bot.web.test_worker import Live, wait_for
from tests.fakes.evaluators import PipelineTable
from tests.fakes.serve import serve_in_thread
from tests.runner.search.test_loop import Scripted


@pytest.fixture
def live(tmp_path, fake_github) -> Iterator[Live]:
    world = make_world(tmp_path, fake_github, scheduler_interval_seconds=0.1, lease_ttl_seconds=3)
    app = create_app(world.settings, ctx=world.ctx, background=True)
    with serve_in_thread(app) as url:
        yield Live(world, url)


class Endless(PipelineTable):
    """Its evaluation never ends by itself; it notes what started after the job was cancelled."""

    def __init__(self, cancelled: threading.Event):
        super().__init__()
        self.cancelled, self.evaluating, self.aborted = cancelled, threading.Event(), threading.Event()
        self.after_cancel: list[str] = []

    def evaluate_many(self, candidates):
        if self.cancelled.is_set():
            self.after_cancel.append("evaluate_many")
        self.evaluating.set()
        self.aborted.wait()
        return []

    def abort(self):
        self.aborted.set()


def test_a_cancelled_job_stops_every_evaluation_and_starts_nothing_after(live, monkeypatch):
    w = live.world
    heard = threading.Event()  # the worker's heartbeat heard of the cancel
    original = worker_cli.Heartbeat.beat

    def beat(self):
        original(self)
        if self.stopping.is_set():
            heard.set()

    monkeypatch.setattr(worker_cli.Heartbeat, "beat", beat)
    ev = Endless(heard)

    @contextlib.contextmanager
    def evaluators(*args, **kwargs):
        yield ev

    monkeypatch.setattr("runner.pipeline.device_evaluators", evaluators)
    proposer = Scripted("a", lambda r, k, j: "ms=1")
    original_ideas, original_implement = proposer.ideas, proposer.implement

    def watched(fn, name):
        def call(*args):
            if heard.is_set():
                ev.after_cancel.append(name)
            return fn(*args)
        return call

    proposer.ideas, proposer.implement = watched(original_ideas, "ideas"), watched(original_implement, "implement")
    w.post("pull_request", pr_payload("labeled", number=2, head_sha=w.shas["feature"], base_sha=w.shas["main"],
                                      label="optimize-kernels"))
    wait_for(lambda: w.jobs(), what="a job")
    settings = WorkerSettings(bot_url=live.url, token=RUNNER_TOKENS["gpu-a"], poll_seconds=0.05,
                              heartbeat_seconds=0.2)
    worker = Worker(settings, run_job=lambda job, src, progress: run_job(job, src, progress,
                                                                         proposers=[(proposer, 1.0)], backend="cpu"))
    t = threading.Thread(target=worker.run, kwargs={"once": True})
    t.start()
    wait_for(ev.evaluating.is_set, timeout_s=60, what="the search to evaluate its first chunk")
    assert w.ctx.store.cancel(REPO, pr_number=2)  # what /fusebot stop and the Stop button do
    wait_for(heard.is_set, timeout_s=30, what="the heartbeat to hear of the cancel")
    t.join(60)
    assert not t.is_alive()
    assert ev.aborted.is_set() and ev.after_cancel == []
    assert {j.state for j in w.jobs()} == {"cancelled"}


def test_a_cancel_is_heard_and_acted_on_within_5_s_by_default():
    # the heartbeat's interval (how soon the worker hears of it), then the abort's grace: the rest is polling
    assert WorkerSettings.model_fields["heartbeat_seconds"].default + GRACE_S <= 5.0
