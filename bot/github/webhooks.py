"""Webhook deliveries, with no I/O: the signature check and event parsing (gidgethub's sansio, in small).

`parse` turns the raw request (headers + body bytes) into an `Event` or raises `InvalidSignature` /
`BadRequest`; the web layer maps those to 401 / 400.
"""

from __future__ import annotations

import hashlib
import hmac
import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any


class InvalidSignature(Exception):
    """X-Hub-Signature-256 is missing or does not match the body."""


class BadRequest(Exception):
    """The delivery is signed but malformed (no event name, no delivery id, body not a JSON object)."""


def sign(body: bytes, secret: bytes) -> str:
    """The X-Hub-Signature-256 value GitHub sends for `body`."""
    return "sha256=" + hmac.new(secret, body, hashlib.sha256).hexdigest()


def verify_signature(body: bytes, signature: str | None, secret: bytes) -> None:
    """HMAC-SHA256 over the raw body, compared in constant time."""
    if not signature or not signature.startswith("sha256="):
        raise InvalidSignature("missing or malformed X-Hub-Signature-256")
    if not hmac.compare_digest(sign(body, secret).encode(), signature.encode()):
        raise InvalidSignature("X-Hub-Signature-256 does not match the body")


@dataclass(frozen=True)
class Event:
    name: str  # X-GitHub-Event, e.g. "pull_request"; internal events start with "fusebot."
    delivery_id: str  # X-GitHub-Delivery, or a synthetic key for internal events
    data: dict[str, Any] = field(default_factory=dict)

    @property
    def action(self) -> str | None:
        return self.data.get("action")

    @property
    def installation_id(self) -> int | None:
        inst = self.data.get("installation")
        return inst.get("id") if isinstance(inst, dict) else None

    @property
    def repo(self) -> str | None:
        repo = self.data.get("repository")
        return repo.get("full_name") if isinstance(repo, dict) else None

    @property
    def sender(self) -> str | None:
        sender = self.data.get("sender")
        return sender.get("login") if isinstance(sender, dict) else None


def parse(headers: Mapping[str, str], body: bytes, secret: bytes) -> Event:
    """Verify and parse one delivery. `headers` must be case-insensitive (Starlette's are) or lower-case keys."""
    verify_signature(body, headers.get("x-hub-signature-256"), secret)
    name = headers.get("x-github-event")
    delivery_id = headers.get("x-github-delivery")
    if not name or not delivery_id:
        raise BadRequest("missing X-GitHub-Event or X-GitHub-Delivery")
    if len(delivery_id) > 200:
        raise BadRequest("X-GitHub-Delivery is too long")
    try:
        data = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise BadRequest("body is not JSON") from None
    if not isinstance(data, dict):
        raise BadRequest("body is not a JSON object")
    return Event(name=name, delivery_id=delivery_id, data=data)
