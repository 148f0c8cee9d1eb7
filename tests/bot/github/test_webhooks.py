"""The pure webhook layer, and GitHub's real payload examples checked against GitHub's own schemas."""

from __future__ import annotations

import json

import pytest

from bot.github.webhooks import REQUIRED, BadRequest, InvalidSignature, missing_fields, parse, sign, verify_signature
from tests.bot.helpers import EXAMPLES, WEBHOOK_SECRET, example, unexpected_differences
from tests.fakes.github_server import load_spec, validation_errors

SECRET = WEBHOOK_SECRET.encode()


def headers(body: bytes, **over: str) -> dict[str, str]:
    h = {"x-github-event": "ping", "x-github-delivery": "d-1", "x-hub-signature-256": sign(body, SECRET)}
    h.update(over)
    return h


def test_signature_roundtrip():
    body = b'{"zen": "Keep it logically awesome."}'
    verify_signature(body, sign(body, SECRET), SECRET)
    ev = parse(headers(body), body, SECRET)
    assert ev.name == "ping" and ev.delivery_id == "d-1" and ev.data["zen"].startswith("Keep")


@pytest.mark.parametrize(
    "signature",
    [None, "", "sha1=abc", "sha256=", "sha256=" + "0" * 64, sign(b"other body", SECRET), sign(b"{}", b"wrong")],
)
def test_bad_signatures_rejected(signature):
    with pytest.raises(InvalidSignature):
        verify_signature(b"{}", signature, SECRET)


def test_body_tampering_detected():
    body = b'{"action": "labeled"}'
    with pytest.raises(InvalidSignature):
        parse(headers(body), body.replace(b"labeled", b"unlabeled"), SECRET)


@pytest.mark.parametrize(
    "body, over",
    [(b"not json", {}), (b"[1, 2]", {}), (b"{}", {"x-github-event": ""}), (b"{}", {"x-github-delivery": ""})],
)
def test_malformed_but_signed(body, over):
    with pytest.raises(BadRequest):
        parse(headers(body, **over), body, SECRET)


@pytest.mark.parametrize("event, example_name, remove", [
    ("pull_request", "pull_request.labeled", "pull_request"),
    ("pull_request", "pull_request.synchronize", "pull_request.head.sha"),
    ("pull_request", "pull_request.opened", "installation"),
    ("issue_comment", "issue_comment.created.with-installation", "comment.id"),
    ("check_run", "check_run.rerequested", "check_run"),
    ("installation", "installation.created", "installation"),
])
def test_a_signed_delivery_without_a_field_its_handlers_read_is_a_bad_request(event, example_name, remove, caplog):
    data = example(example_name)
    data.setdefault("installation", {"id": 1})
    assert missing_fields(event, data) == []
    *parents, last = remove.split(".")
    holder = data
    for part in parents:
        holder = holder[part]
    del holder[last]
    body = json.dumps(data).encode()
    with pytest.raises(BadRequest) as e:
        parse(headers(body, **{"x-github-event": event}), body, SECRET)
    assert remove in str(e.value)
    assert f"webhook refused (400): {event} delivery without {remove}" in caplog.text


def test_a_field_of_the_wrong_type_is_missing():
    data = example("issue_comment.created.with-installation")
    data["issue"]["number"] = "2"
    data["comment"]["id"] = True
    assert missing_fields("issue_comment", data) == ["issue.number", "comment.id"]
    assert set(REQUIRED) == {"pull_request", "issue_comment", "check_run", "installation", "installation_repositories"}
    assert missing_fields("ping", {}) == []  # events fusebot does not handle are not checked


EXAMPLE_FILES = sorted(p.name.removesuffix(".payload.json") for p in EXAMPLES.glob("*.payload.json"))


def schema_key(example: str) -> str:
    event, _, rest = example.partition(".")
    action = rest.split(".")[0] if rest and not rest.startswith("with") else ""
    return event.replace("_", "-") + (f"-{action.replace('_', '-')}" if action else "")


@pytest.mark.parametrize("name", EXAMPLE_FILES)
def test_examples_match_github_schemas(name):
    schema = load_spec()["x-webhooks"][schema_key(name)]["post"]["requestBody"]["content"]["application/json"]
    errors = validation_errors(schema["schema"], json.loads((EXAMPLES / f"{name}.payload.json").read_text()))
    assert unexpected_differences(name, errors) == []


def test_schema_key_mapping_is_not_vacuous():
    keys = {schema_key(n) for n in EXAMPLE_FILES}
    assert {"pull-request-labeled", "issue-comment-created", "check-run-requested-action", "ping"} <= keys
    assert keys <= set(load_spec()["x-webhooks"])
