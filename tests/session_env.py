"""What a test passes on to a fusebot process it starts with an environment of its own."""

from __future__ import annotations

import os

# FUSEBOT_CACHE_DIR: the session's harness cache (tests/conftest.py). FUSEBOT_UNSTABLE_SPREAD: the suite's spread
# threshold for confirmation rounds on a loaded two-core host (tests/conftest.py).
_PASSED_ON = ("FUSEBOT_CACHE_DIR", "FUSEBOT_UNSTABLE_SPREAD")


def session_env() -> dict[str, str]:
    return {name: os.environ[name] for name in _PASSED_ON if name in os.environ}
