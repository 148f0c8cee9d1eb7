"""The App's conversation with maintainers, driven through the real app against the fake GitHub: commands answered
even when a reaction is refused, `/fusebot status` with states, attempts and times, the status comment following
newer runs, the config reported once per commit, malformed deliveries refused, and a stale installation token
replaced."""

from __future__ import annotations

import json
import logging
import re

from bot.features.commands import HELP
from bot.features.status import STATUS_MARKER
from tests.bot.helpers import REPO, comment_payload, pr_payload, signed_headers

LABEL = "optimize-kernels"
REACTIONS = "POST /repos/{owner}/{repo}/issues/comments/{comment_id}/reactions"
STATUS_COMMENT = "<!-- fusebot:status key=pr-2 -->"


def command(world, body: str, comment_id: int) -> None:
    world.fake.add_comment(REPO, 2, comment_id, body, "maintainer")
    assert world.post("issue_comment", comment_payload(body, number=2, comment_id=comment_id)).status_code == 202
    world.drain()


def label(world, delivery: str | None = None) -> None:
    world.post("pull_request", pr_payload("labeled", number=2, head_sha=world.shas["feature"],
                                          base_sha=world.shas["main"], label=LABEL), delivery=delivery)
    world.drain()


def lease(world) -> dict:
    return world.client.post("/runner/v1/lease", headers=world.runner("gpu-a")).json()


def finish(world, leased: dict) -> None:
    """The runner's result: searched, nothing faster (an ok result with no targets)."""
    job_id = leased["job"]["id"]
    headers = {**world.runner("gpu-a"), "X-Fusebot-Lease": leased["lease_token"]}
    r = world.client.post(f"/runner/v1/jobs/{job_id}/result", json={"job_id": job_id, "ok": True, "targets": []},
                          headers=headers)
    assert r.json() == {"recorded": True}
    world.drain()


def status_comment(world) -> str:
    [body] = [c for c in world.fake.comments_on(REPO, 2) if STATUS_COMMENT in c]
    return body


# ---- commands ----------------------------------------------------------------------------------------------


def test_a_refused_reaction_is_logged_and_the_command_still_answered(world, caplog):
    caplog.set_level(logging.WARNING)
    world.fake.fail_next[REACTIONS] = 422
    command(world, "/fusebot status", comment_id=1)
    [answer] = world.fake.comments_on(REPO, 2)
    assert answer.startswith(STATUS_MARKER)
    assert world.fake.calls_to("POST", "/reactions")[0].status == 422 and world.fake.reactions == []
    assert world.ctx.store.delivery_counts() == {"done": 1}  # handled once, not retried
    assert "reaction '+1' to comment 1 not added (the command is answered anyway)" in caplog.text


def test_a_bare_fusebot_answers_with_the_help(world):
    command(world, "/fusebot", comment_id=1)
    assert world.fake.comments_on(REPO, 2) == [HELP]
    assert [r["content"] for r in world.fake.reactions] == ["+1"]


def test_status_shows_each_runs_state_attempts_and_times(world):
    label(world)
    leased = lease(world)
    command(world, "/fusebot status", comment_id=1)
    finish(world, leased)
    command(world, "/fusebot status", comment_id=2)
    first, second = [c for c in world.fake.comments_on(REPO, 2) if c.startswith(STATUS_MARKER)]
    stamp = r"\d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC"
    assert "| state | attempts | queued | started | finished |" in first
    assert re.search(rf"\| label \| leased \| 1 \| {stamp} \| {stamp} \| – \|", first), first
    assert re.search(rf"\| label \| succeeded \| 1 \| {stamp} \| {stamp} \| {stamp} \|", second), second


def test_the_status_comment_follows_a_newer_run_and_its_cancellation(world):
    label(world)
    finish(world, lease(world))
    assert "**fusebot**: no faster kernel found" in status_comment(world)
    command(world, "/fusebot run", comment_id=1)  # a newer run: the comment no longer shows the last one as current
    assert "**fusebot**: queued" in status_comment(world)
    command(world, "/fusebot stop", comment_id=2)
    body = status_comment(world)
    assert "**fusebot**: cancelled" in body and "no faster kernel found" not in body
    assert world.fake.comments_on(REPO, 2).count(body) == 1  # one status comment, edited in place


# ---- the config, once per commit ---------------------------------------------------------------------------


def test_an_invalid_config_is_reported_once_per_commit(world):
    sha = world.repo.commit({".github/fusebot.yml": "budgett:\n  rounds: 1\n"}, "config", branch="feature")
    world.fake.pulls[(REPO, 2)].head_sha = sha
    world.post("pull_request", pr_payload("opened", number=2, head_sha=sha, base_sha=world.shas["main"]))
    world.post("pull_request", pr_payload("labeled", number=2, head_sha=sha, base_sha=world.shas["main"],
                                          label=LABEL))
    world.drain()
    runs = [r for r in world.fake.check_runs.values() if r["name"] == "fusebot config"]
    assert len(runs) == 1 and world.jobs() == []
    [ann] = runs[0]["output"]["annotations"]
    assert ann["message"] == "budgett: unknown key (did you mean `budget`?)" and ann["start_line"] == 2


# ---- webhooks and tokens -----------------------------------------------------------------------------------


def test_a_signed_delivery_missing_its_pull_request_is_refused_once_and_never_queued(world, caplog):
    caplog.set_level(logging.WARNING)
    payload = pr_payload("labeled", number=2, head_sha=world.shas["feature"], base_sha=world.shas["main"],
                         label=LABEL)
    del payload["pull_request"]
    body = json.dumps(payload).encode()
    r = world.client.post("/webhook", content=body, headers=signed_headers("pull_request", body, "bad-1"))
    assert r.status_code == 400 and "pull_request.number" in r.json()["error"]
    world.drain()
    assert world.ctx.store.delivery_counts() == {} and world.jobs() == []
    assert "webhook refused (400): pull_request delivery without pull_request.number" in caplog.text


def test_a_revoked_installation_token_is_replaced_and_the_request_retried_once(world, caplog):
    caplog.set_level(logging.WARNING)
    command(world, "/fusebot help", comment_id=1)
    minted = world.fake.calls_to("POST", "/access_tokens")
    assert len(minted) == 1
    world.fake.tokens.clear()  # GitHub no longer takes the token the bot holds
    command(world, "/fusebot help", comment_id=2)
    assert world.fake.comments_on(REPO, 2) == [HELP, HELP]
    assert len(world.fake.calls_to("POST", "/access_tokens")) == 2
    assert [c.status for c in world.fake.calls if "/permission" in c.path] == [200, 401, 200]
    assert "the installation token was dropped, retrying once on a new one" in caplog.text


class RefusesEveryToken(dict):
    """The fake's issued tokens, forgotten as they are issued: every installation token is refused."""

    def __setitem__(self, key, value) -> None:
        pass


def test_a_second_401_is_not_retried_again(world):
    command(world, "/fusebot help", comment_id=1)
    world.fake.tokens = RefusesEveryToken()
    command(world, "/fusebot help", comment_id=2)
    assert [c.status for c in world.fake.calls if "/permission" in c.path] == [200, 401, 401]  # one retry, no loop
    assert len(world.fake.calls_to("POST", "/access_tokens")) == 2
    assert world.fake.comments_on(REPO, 2) == [HELP]
    assert sorted(world.ctx.store.delivery_counts()) == ["done", "pending"]  # the second is retried later
