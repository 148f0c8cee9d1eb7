"""Logging set-up with a filter that masks every configured secret, wherever it would appear."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterable

_TOKEN_IN_URL = re.compile(r"(x-access-token:)[^@/\s]+@")


class RedactSecrets(logging.Filter):
    """Replaces each known secret (and any token embedded in a clone URL) with ***. Attach to handlers."""

    def __init__(self, secrets: Iterable[str] = ()) -> None:
        super().__init__()
        self.secrets: set[str] = {s for s in secrets if s}

    def add(self, secret: str) -> None:
        if secret:
            self.secrets.add(secret)

    def filter(self, record: logging.LogRecord) -> bool:
        msg = record.getMessage()
        clean = _TOKEN_IN_URL.sub(r"\1***@", msg)
        for s in self.secrets:
            if s in clean:
                clean = clean.replace(s, "***")
        if clean != msg:
            record.msg, record.args = clean, None
        return True


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    text = _TOKEN_IN_URL.sub(r"\1***@", text)
    for s in secrets:
        if s:
            text = text.replace(s, "***")
    return text


def setup_logging(level: str, secrets: Iterable[str]) -> RedactSecrets:
    flt = RedactSecrets(secrets)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(flt)
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    return flt
