"""The fake GitHub is itself checked: it refuses what GitHub's OpenAPI description does not allow, and it
authenticates like GitHub (App JWT for /app, installation tokens for the rest)."""

from __future__ import annotations

import time

import httpx
import jwt
import pytest

from tests.bot.helpers import APP_ID, rsa_keys
from tests.fakes.github_server import FakeGitHub, fill, load_spec, validation_errors


def test_fill_completes_a_schema_and_validates():
    schema = load_spec()["paths"]["/repos/{owner}/{repo}/pulls/{pull_number}"]["get"]["responses"]["200"][
        "content"]["application/json"]["schema"]
    value = fill(schema, {"number": 3, "head": {"sha": "a" * 40}})
    assert value["number"] == 3 and value["head"]["sha"] == "a" * 40
    assert validation_errors(schema, value) == []
    assert validation_errors(schema, {**value, "number": "three"})  # and the validator is not a rubber stamp


def test_undocumented_requests_are_errors(fake_github: FakeGitHub):
    with httpx.Client(base_url=fake_github.base_url) as c:
        assert c.get("/repos/o/r/not-an-endpoint").status_code == 404
        assert c.put("/repos/o/r/check-runs").status_code == 404  # a method the description lacks
        assert c.post("/repos/o/r/check-runs", json={"name": 1}).status_code == 422  # body against the schema
        assert c.get("/repos/o/r/pulls/two").status_code == 422  # path parameter type
    assert len(fake_github.errors) == 4
    fake_github.errors.clear()  # expected here: keep the fixture's own check for the other tests


def test_app_endpoints_need_the_apps_jwt(fake_github: FakeGitHub, tmp_path):
    fake_github.add_repo("o/r", 9, tmp_path)
    url = "/app/installations/9/access_tokens"
    now = int(time.time())
    good = jwt.encode({"iat": now - 60, "exp": now + 540, "iss": str(APP_ID)}, rsa_keys()[0], algorithm="RS256")
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    other = rsa.generate_private_key(public_exponent=65537, key_size=2048).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    forged = jwt.encode({"iat": now - 60, "exp": now + 540, "iss": str(APP_ID)}, other, algorithm="RS256")
    with httpx.Client(base_url=fake_github.base_url) as c:
        assert c.post(url, headers={"Authorization": f"Bearer {forged}"}, json={}).status_code == 401
        r = c.post(url, headers={"Authorization": f"Bearer {good}"}, json={})
        assert r.status_code == 201
        token = r.json()["token"]
        assert c.get("/repos/o/r", headers={"Authorization": f"token {token}"}).status_code == 200
        assert c.get("/repos/o/r", headers={"Authorization": "token ghs_forged"}).status_code == 401


@pytest.mark.parametrize("status", [502, 503])
def test_github_outage_delays_but_loses_nothing(world, status):
    from datetime import timedelta

    from bot.store.db import utcnow
    from tests.bot.helpers import pr_payload

    world.fake.outage = status
    world.post("pull_request", pr_payload("labeled", number=2, head_sha=world.shas["feature"],
                                          base_sha=world.shas["main"], label="optimize-kernels"), delivery="d")
    world.drain()
    assert world.jobs() == [] and world.ctx.store.delivery_status("d") == "pending"  # kept, to retry
    world.fake.outage = 0
    assert world.drain() == 0  # backing off: not retried at once
    assert world.client.app.state.background.handle_one(now=utcnow() + timedelta(minutes=10))
    assert len(world.jobs()) == 1 and world.ctx.store.delivery_status("d") == "done"
