"""A target's whole budget: when it ends, how it is split among the stages, and the cancel that ends it early.

    deadline = Deadline(budget.wall_seconds, start_s=process_start_s())   # a command's budget counts its own start
    split = plan_split(budget.wall_seconds, reserve_s=exit_reserve_s(budget.wall_seconds))
    log.info("%s", split.announce())
    search(..., deadline=deadline.until(split.search_end_s)) # the search stops where the confirmation's share starts

The budget bounds everything a target costs: the command's own start (Python and torch), the reference's capture and
baselines, the search, the confirmation of its finalists, the bench script's run and the command's exit (its share
kept at the end: EXIT_SHARE). A step of the setup still running when the search's share ends is cut off too
(runner/search/cutoff.py `within`). The search gets what the setup left, less the confirmation's share; the
confirmation runs its rounds until the deadline, at least one. A cancel (the App's Stop button, a cancelled job) ends
every stage at once: `Deadline.cancelled()` says so, and the search raises `Cancelled`.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

# The confirmation's share of the budget: re-timing the finalists against both baselines, each round as long as one
# baseline measurement and one candidate's timing.
CONFIRM_SHARE = 0.15

# What a command keeps of its budget for its own end: writing the result folder and closing the judge and the
# candidates' processes (under 0.1 s after a cut-off setup on 2 CPU cores under a load of 7; the interpreter's own
# teardown, 3.6 s there after `import torch`, is skipped: runner/cli/common.py exit_now). A share of small budgets, at
# most EXIT_MAX_S of large ones.
EXIT_SHARE = 0.05
EXIT_MAX_S = 10.0


def exit_reserve_s(budget_s: float) -> float:
    return min(budget_s * EXIT_SHARE, EXIT_MAX_S)


# A process older than this when a command starts is not the command's own (a test runner or a notebook calling it
# in-process): its budget starts at the call.
STARTUP_MAX_S = 120.0


def process_start_s(clock: Callable[[], float] = time.monotonic, age_s: float | None = None) -> float:
    """When this process started, on `clock`: a command's budget counts its own start (importing torch takes seconds
    on a loaded machine). Now, where the start cannot be read, or where the process is older than any start-up
    (STARTUP_MAX_S: the command was called inside a longer-lived process). `age_s`: the process's age, read from the
    process table when None."""
    if age_s is None:
        try:
            import psutil

            age_s = time.time() - psutil.Process().create_time()
        except Exception:  # noqa: BLE001 - no process table: the budget starts now
            age_s = 0.0
    if age_s > STARTUP_MAX_S:
        age_s = 0.0
    return clock() - max(0.0, age_s)


class Cancelled(Exception):  # noqa: N818 - a stop signal, not an error
    """The work was cancelled (the App's Stop, a cancelled job, a lost lease): nothing more is started."""


def refuse_budget(seconds: float, option: str) -> str | None:
    """Why a wall budget cannot run (zero, negative or not a number), or None."""
    if not seconds > 0:
        return (f"{option} must be more than 0 seconds, not {seconds:g}: it bounds the whole run (baselines, search, "
                "confirmation)")
    return None


@dataclass
class Deadline:
    """An absolute end on a clock (`time.monotonic` unless injected), and an optional cancel event shared with
    every stage."""

    seconds: float
    clock: Callable[[], float] = time.monotonic
    cancel: threading.Event = field(default_factory=threading.Event)
    start_s: float = field(default=-1.0)
    after_s: float = 0.0  # of the whole budget, what is left for the stages after this one (`until`)

    def __post_init__(self) -> None:
        if self.start_s < 0:
            self.start_s = self.clock()

    @property
    def end_s(self) -> float:
        return self.start_s + self.seconds

    def elapsed_s(self) -> float:
        return self.clock() - self.start_s

    def left_s(self) -> float:
        return self.end_s - self.clock()

    def cancelled(self) -> bool:
        return self.cancel.is_set()

    def over(self) -> bool:
        """Cancelled, or no time left."""
        return self.cancelled() or self.left_s() <= 0

    def until(self, seconds_from_start: float) -> Deadline:
        """A deadline on the same clock and cancel that ends `seconds_from_start` after this one started (never
        after this one ends)."""
        seconds = min(seconds_from_start, self.seconds)
        return Deadline(seconds, self.clock, self.cancel, self.start_s, self.after_s + self.seconds - seconds)


@dataclass(frozen=True)
class Split:
    """How a target's budget is shared: capture and baselines first, then the search until `search_end_s` (seconds
    from the start), then the confirmation of the finalists until the end."""

    total_s: float
    search_end_s: float
    reserve_s: float = 0.0  # kept after the confirmation: the result folder and the command's exit

    @property
    def work_end_s(self) -> float:
        """Where the confirmation ends: the reserve is left."""
        return self.total_s - self.reserve_s

    @property
    def confirm_s(self) -> float:
        return self.work_end_s - self.search_end_s

    def announce(self) -> str:
        tail = f", then {self.reserve_s:.1f} s to write the results and exit" if self.reserve_s else ""
        return (f"budget {self.total_s:g} s for the whole run: capture and baselines, then the search until "
                f"{self.search_end_s:.0f} s, then the confirmation of the finalists ({self.confirm_s:.0f} s){tail}")


def plan_split(total_s: float, confirm_share: float = CONFIRM_SHARE, reserve_s: float = 0.0) -> Split:
    """The search ends where the confirmation's share of the budget (less the reserve) starts."""
    work_s = total_s - reserve_s
    return Split(total_s=total_s, search_end_s=work_s * (1.0 - confirm_share), reserve_s=reserve_s)
