"""Redaction: configured secrets and GitHub token shapes never reach a log handler."""

from __future__ import annotations

import logging

from bot.logs import install_redaction, redact
from tests.bot.helpers import rsa_keys


def test_redact_patterns():
    assert redact("clone https://x-access-token:ghs_abc@github.com/o/r.git") == (
        "clone https://x-access-token:***@github.com/o/r.git"
    )
    assert redact('{"token": "ghs_16C7e42F292c6912E7710c838347Ae178B4a"}') == '{"token": "ghs_***"}'
    assert redact("key " + rsa_keys()[0]) == "key <private key>\n"
    assert redact("a s3cr3t-value-123 b", ["s3cr3t-value-123"]) == "a *** b"


def test_installed_redaction_covers_every_handler(caplog):
    caplog.set_level(logging.DEBUG)
    install_redaction(["runner-token-for-redaction-test"])
    log = logging.getLogger("some.library")
    log.debug("auth %s and %s", "runner-token-for-redaction-test", "ghs_16C7e42F292c6912E7710c838347Ae178B4a")
    try:
        raise RuntimeError("failed with runner-token-for-redaction-test")
    except RuntimeError:
        log.exception("boom")
    text = caplog.text
    assert "runner-token-for-redaction-test" not in text and "ghs_16C7e42F" not in text
    assert "auth *** and ghs_***" in text and "RuntimeError: failed with ***" in text
