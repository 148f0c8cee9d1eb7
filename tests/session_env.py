"""What a test passes on to a fusebot process it starts with an environment of its own."""

from __future__ import annotations

import os

# FUSEBOT_CACHE_DIR: the session's harness cache; the others: the suite's timing on a loaded two-core host (the
# names of tests/conftest.py's SUITE_TIMING), unset for tests marked `timing`.
_PASSED_ON = ("FUSEBOT_CACHE_DIR", "FUSEBOT_UNSTABLE_SPREAD", "FUSEBOT_TIMER_MAX_SECONDS", "FUSEBOT_CPU_CHECK_MS",
              "FUSEBOT_CONFIRM_ROUNDS")


def session_env() -> dict[str, str]:
    return {name: os.environ[name] for name in _PASSED_ON if name in os.environ}


# What a claim denied by measurement alone says (runner/results/choice.py, runner/harness/confirm.py,
# runner/harness/measure.py): the kernel was verified, and the confirmation's rounds on a loaded host did not agree
# enough for a figure, or the parent's clocks did not bear out the timer's (an honest one-thread kernel beside a CPU hog
# measured 0.30 ms by its timer and 3.1 ms a call by the parent's clock and CPU time: a timer-escape verdict).
_NOISE = ("nothing beat", "below the minimum effect", "the rounds' medians spread", "unstable-measurement",
          "timer-escape", "slower: ", "not provable on this host")


def says_measurement_denied(text: str) -> bool:
    """Whether a message, summary or check run says a claim was denied by measurement alone."""
    return any(s in text for s in _NOISE)


def denied_by_noise(result: dict) -> bool:
    """A `result.json` whose verified kernel a loaded host's timing noise kept from being proposed (the CI machine
    has two cores and runs two test processes)."""
    return not result.get("improved") and says_measurement_denied(result.get("message") or "")
