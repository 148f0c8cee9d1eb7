"""What a unit's attempts are told as: the note a unit carries into its next lease after its worker was lost, and the
error of a unit whose worker was lost on its last attempt. The check run, the status comment, `/fusebot status` and
the worker's log show these words as they are (bot/store/units.py writes them)."""

from __future__ import annotations


def attempt_of(attempt: int, max_attempts: int) -> str:
    """`attempt 2 of 3` (a unit given back by stopping workers may be leased past the cap: `attempt 4`)."""
    return f"attempt {attempt} of {max_attempts}" if attempt <= max_attempts else f"attempt {attempt}"


def lost_worker_note(attempt: int, max_attempts: int, runner: str | None) -> str:
    """After the worker stopped heart-beating: `attempt 2 of 3: the previous worker stopped answering (runner X)`."""
    return f"{attempt_of(attempt, max_attempts)}: the previous worker stopped answering{_on(runner)}"


def given_back_note(attempt: int, max_attempts: int, runner: str | None) -> str:
    """After the worker was stopped (SIGTERM) and released the unit."""
    return f"{attempt_of(attempt, max_attempts)}: the previous worker was stopped and gave it back{_on(runner)}"


def lost_on_last_attempt(attempts: int, max_attempts: int, runner: str | None) -> str:
    """The error of a unit whose worker stopped answering when no attempt was left."""
    return (f"{attempt_of(attempts, max_attempts)}: the worker stopped answering{_on(runner)} and its lease expired; "
            "no attempts are left")


def _on(runner: str | None) -> str:
    return f" (runner {runner})" if runner else ""
