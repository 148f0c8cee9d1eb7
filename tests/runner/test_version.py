"""runner.version: the version a result and a PR state names the release and, from a checkout, its commit."""

from __future__ import annotations

import subprocess
from importlib.metadata import version

from runner import version as fusebot_version_module
from runner.version import ROOT, fusebot_version


def test_a_checkout_names_its_release_and_commit(monkeypatch):
    monkeypatch.delenv("FUSEBOT_COMMIT", raising=False)
    fusebot_version.cache_clear()
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True).stdout.strip()
    assert fusebot_version() == f"{version('fusebot')}+g{head[:12]}"


def test_fusebot_commit_names_the_commit_where_the_tree_cannot(monkeypatch):
    monkeypatch.setenv("FUSEBOT_COMMIT", "0123456789abcdef0123")
    monkeypatch.setattr(fusebot_version_module, "_checkout_commit", lambda: "")
    fusebot_version.cache_clear()
    try:
        assert fusebot_version() == f"{version('fusebot')}+g0123456789ab"
        monkeypatch.delenv("FUSEBOT_COMMIT")
        fusebot_version.cache_clear()
        assert fusebot_version() == version("fusebot")  # an installed release without a checkout: no "unknown"
    finally:
        fusebot_version.cache_clear()
