"""A running search's check run follows its progress (round, built, verified, best) as a runner's heartbeats report
it: rewritten when it changed, at most once every 10 s, never left at the round it showed when the job started.
Driven through the runner API of a bot on the fake GitHub, with a fake clock for the 10 s."""

from __future__ import annotations

from bot.publish.notify import PROGRESS_INTERVAL_S, ProgressOutbox
from tests.bot.helpers import pr_payload

LEASE = "X-Fusebot-Lease"


class Clock:
    def __init__(self) -> None:
        self.t = 500.0

    def __call__(self) -> float:
        return self.t


def titles(world) -> list[str]:
    [run] = [r for r in world.fake.check_runs.values() if r["name"] == "fusebot"]
    return [c.body["output"]["title"] for c in world.fake.calls_to("PATCH", f"/check-runs/{run['id']}")]


def test_the_check_run_follows_the_progress_at_most_once_every_10_s(world):
    clock = Clock()
    world.client.app.state.background.progress = ProgressOutbox(clock=clock)
    world.post("pull_request", pr_payload("labeled", number=2, head_sha=world.shas["feature"],
                                          base_sha=world.shas["main"], label="optimize-kernels"))
    world.drain()  # the job, and its check run: queued
    leased = world.client.post("/runner/v1/lease", headers=world.runner("gpu-a")).json()
    unit = leased["job"]["id"]
    hdr = {**world.runner("gpu-a"), LEASE: leased["lease_token"]}

    def beat(**progress) -> None:
        r = world.client.post(f"/runner/v1/jobs/{unit}/heartbeat", json=progress, headers=hdr)
        assert r.json() == {"state": "running"}

    beat(round=1, built=0, verified=0)
    world.drain()  # running: the state outbox writes it
    assert titles(world)[-1] == "Searching: round 1, 0 built, 0 verified"
    shown = len(titles(world))

    clock.t += 3
    beat(round=1, built=4, verified=2, best_speedup=1.25)
    world.drain()
    assert len(titles(world)) == shown  # 3 s after the last write: not yet

    clock.t += PROGRESS_INTERVAL_S
    beat(round=2, built=6, verified=3, best_speedup=1.4)
    world.drain()
    assert titles(world)[shown:] == ["Searching: round 2, 6 built, 3 verified, best 1.40x unconfirmed"]

    clock.t += 60
    world.drain()  # nothing moved: nothing is written
    assert len(titles(world)) == shown + 1

    beat(round=3, built=9, verified=5, best_speedup=1.6)
    world.drain()
    assert titles(world)[-1] == "Searching: round 3, 9 built, 5 verified, best 1.60x unconfirmed"
