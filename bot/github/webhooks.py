"""Webhook deliveries, with no I/O: the signature check and event parsing (gidgethub's sansio, in small).

`parse` turns the raw request (headers + body bytes) into an `Event` or raises `InvalidSignature` /
`BadRequest`; the web layer maps those to 401 / 400. A signed delivery of an event fusebot handles must carry the
fields its handlers read (`REQUIRED`): one that lacks any is refused here, with the reason logged, and never queued,
so it cannot fail in a handler and be retried.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import logging
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

# Per event: the fields (dotted paths) its handlers read, and their JSON types. Every App delivery names its
# installation; `head.repo` may be null (a deleted fork) and is not required.
_APP = (("repository.full_name", str), ("installation.id", int))
REQUIRED: dict[str, tuple[tuple[str, type], ...]] = {
    "pull_request": (("pull_request.number", int), ("pull_request.state", str), ("pull_request.head.sha", str),
                     ("pull_request.head.ref", str), ("pull_request.base.sha", str), ("pull_request.base.ref", str),
                     ("pull_request.base.repo.full_name", str), *_APP),
    "issue_comment": (("issue.number", int), ("comment.id", int), *_APP),
    "check_run": (("check_run.id", int), *_APP),
    "installation": (("installation.id", int),),
    "installation_repositories": (("installation.id", int),),
}

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


def missing_fields(name: str, data: dict[str, Any]) -> list[str]:
    """The fields `name`'s handlers need that `data` lacks or holds with the wrong type ("pull_request.head.sha")."""
    missing = []
    for path, kind in REQUIRED.get(name, ()):
        value: Any = data
        for part in path.split("."):
            value = value.get(part) if isinstance(value, dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            missing.append(path)
    return missing


def parse(headers: Mapping[str, str], body: bytes, secret: bytes) -> Event:
    """Verify and parse one delivery. `headers` must be case-insensitive (Starlette's are) or lower-case keys."""
    verify_signature(body, headers.get("x-hub-signature-256"), secret)
    try:
        return _parse(headers, body)
    except BadRequest as e:
        log.warning("webhook refused (400): %s (event %s, delivery %s)", e, headers.get("x-github-event"),
                    str(headers.get("x-github-delivery"))[:200])
        raise


def _parse(headers: Mapping[str, str], body: bytes) -> Event:
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
    missing = missing_fields(name, data)
    if missing:
        raise BadRequest(f"{name} delivery without {', '.join(missing)}")
    return Event(name=name, delivery_id=delivery_id, data=data)
