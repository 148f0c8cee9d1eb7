"""Logging set-up, and redaction that masks secrets in every log record, whatever handler receives it.

`install_redaction(secrets)` wraps the log record factory once per process: each record's message is checked for
the configured secrets (webhook secret, App key, runner tokens), for GitHub token shapes (installation tokens that
libraries may log in a response body), tokens embedded in clone URLs, API keys, PEM blocks and Authorization headers.
The text layer (bot/publish/text.py) masks what it publishes with the same `redact`.
"""

from __future__ import annotations

import logging
import re
import threading
from collections.abc import Iterable
from typing import Any

from runner.contract import inert

# Credential shapes: GitHub tokens (also inside clone URLs), API keys (`sk-...`), PEM blocks (a block cut short is
# masked to the end of the text), Authorization headers.
_PATTERNS = [
    (re.compile(r"(x-access-token:)[^@/\s]+@"), r"\1***@"),
    (re.compile(r"\b(ghs|ghp|gho|ghu|ghr)_[A-Za-z0-9]{16,}"), r"\1_***"),
    (re.compile(r"\bgithub_pat_\w{20,}"), "github_pat_***"),
    (re.compile(r"\bsk-(?:[A-Za-z0-9]+-)*[A-Za-z0-9_]{16,}"), "sk-***"),
    (re.compile(r"-----BEGIN [A-Z0-9 ]+-----.*?(?:-----END [A-Z0-9 ]+-----|\Z)", re.S), "<private key>"),
    (re.compile(r"(?i)\b((?:proxy-)?authorization[\"']?\s*[:=]\s*[\"']?)(?:(?:bearer|token|basic)\s+)?[^\s\"',;]+"),
     r"\1***"),
]


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """`text` without credentials, and inert (runner.contract.inert: no control character but newline and tab)."""
    text = inert(text)
    for rx, repl in _PATTERNS:
        text = rx.sub(repl, text)
    for s in secrets:
        if s:
            text = text.replace(s, "***")
            if "\n" in s:  # a PEM key: also each of its lines
                for line in s.splitlines():
                    if len(line) >= 32:
                        text = text.replace(line, "***")
    return text


class _Redactor:
    def __init__(self) -> None:
        self.secrets: set[str] = set()
        self.lock = threading.Lock()
        self.installed = False

    def __call__(self, record: logging.LogRecord) -> None:
        try:
            msg = record.getMessage()
        except Exception:  # a broken format string: leave it to logging's own error path
            return
        clean = redact(msg, self.secrets)
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact(record.exc_text, self.secrets)
        if clean != msg:
            record.msg, record.args = clean, None


_redactor = _Redactor()


def install_redaction(secrets: Iterable[str]) -> None:
    """Mask these secrets (and GitHub token shapes) in every log record from now on. Safe to call repeatedly."""
    with _redactor.lock:
        _redactor.secrets.update(s for s in secrets if s)
        if _redactor.installed:
            return
        previous = logging.getLogRecordFactory()

        def factory(*args: Any, **kwargs: Any) -> logging.LogRecord:
            record = previous(*args, **kwargs)
            _redactor(record)
            return record

        logging.setLogRecordFactory(factory)
        _redactor.installed = True


def setup_logging(level: str, secrets: Iterable[str]) -> None:
    install_redaction(secrets)
    handler = logging.StreamHandler()
    handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
