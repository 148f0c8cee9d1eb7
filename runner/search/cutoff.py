"""One chunk of candidates evaluated under a deadline: cut off when the budget runs out or the work is cancelled.

    verdicts = evaluate_until(evaluator, candidates, deadline)   # raises BudgetExhausted / Cancelled when cut off
    ctx = within(deadline, prepare, "timing the baselines")    # any other step of a target, cut off the same way

The evaluator runs on a thread of its own while this one watches the deadline. When it is over, the evaluator's
`abort()` (runner/harness/evaluator.py: kills the candidates' processes, starts no new one) ends the chunk, and
`ChunkCutOff` is raised: it holds why (the budget or a cancel) and the verdicts of the chunk's candidates that were
evaluated in full before the cut, which the search archives; the others' are dropped (a resumed search evaluates them
again), and the search stops. The time a cut-off chunk took is the budget's, not added on after it.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any, TypeVar

from runner.contract import CUT_OFF, Candidate, Verdict
from runner.search.deadline import Cancelled, Deadline
from runner.search.types import BudgetExhausted

log = logging.getLogger(__name__)

POLL_S = 0.05  # how often the deadline is looked at while a chunk runs
# how long an aborted chunk is waited for before the search goes on without it: with the worker's 2 s heartbeat, a
# cancelled job stops within 5 s
GRACE_S = 2.5

T = TypeVar("T")


def evaluate_until(evaluator: Any, candidates: list[Candidate], deadline: Deadline | None, *, poll_s: float = POLL_S,
                   grace_s: float = GRACE_S) -> list[Verdict]:
    """`evaluator.evaluate_many(candidates)`, cut off when `deadline` is over (cancelled, or no time left)."""
    if deadline is None:
        return evaluator.evaluate_many(candidates)
    if deadline.over():
        raise _why(deadline, 0)
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["verdicts"] = evaluator.evaluate_many(candidates)
        except BaseException as e:  # noqa: BLE001 - handed back to the search's thread
            box["error"] = e
        finally:
            done.set()

    thread = threading.Thread(target=work, name="evaluate", daemon=True)
    try:  # from the start: a Ctrl-C the moment the chunk begins aborts it too
        thread.start()
        while not done.wait(poll_s):
            if deadline.over():
                _abort(evaluator, done, grace_s)
                finished = {i: v for i, v in enumerate(box.get("verdicts") or []) if CUT_OFF not in v.reasons}
                raise ChunkCutOff(_why(deadline, len(candidates) - len(finished)), finished)
    except KeyboardInterrupt:  # Ctrl-C: nothing of the chunk outlives the search
        _abort(evaluator, done, 0.0)
        raise
    if "error" in box:
        raise box["error"]
    return box["verdicts"]


def within(deadline: Deadline | None, fn: Callable[[], T], what: str, *, poll_s: float = POLL_S) -> T:
    """`fn()`, or BudgetExhausted / Cancelled as soon as `deadline` is over while it runs (`what` it was doing, in
    the message). A step cut off is left behind on a daemon thread: the caller stops what it waits on (the
    evaluator's processes), and a process that exits takes it along."""
    if deadline is None:
        return fn()
    if deadline.over():
        raise _why(deadline, 0, what)
    box: dict[str, Any] = {}
    done = threading.Event()

    def work() -> None:
        try:
            box["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the caller's thread
            box["error"] = e
        finally:
            done.set()

    threading.Thread(target=work, name=what[:20] or "step", daemon=True).start()
    while not done.wait(poll_s):
        if deadline.over():
            raise _why(deadline, 0, what)
    if "error" in box:
        raise box["error"]
    return box["value"]


class ChunkCutOff(Exception):  # noqa: N818 - a stop signal, not an error
    """A chunk cut off: `stop` is why (BudgetExhausted or Cancelled), `finished` the verdicts of its candidates that
    were evaluated in full before the cut, by their index in the chunk."""

    def __init__(self, stop: Exception, finished: dict[int, Verdict]):
        super().__init__(str(stop))
        self.stop, self.finished = stop, finished


def _abort(evaluator: Any, done: threading.Event, grace_s: float) -> None:
    abort = getattr(evaluator, "abort", None)
    if abort is not None:
        abort()
    if grace_s and not done.wait(grace_s):
        log.warning("the evaluation did not stop within %.0f s of its abort; going on without it", grace_s)


def _why(deadline: Deadline, n: int, what: str = "") -> Exception:
    cut = f"; {n} candidate(s) in evaluation cut off" if n else ""
    cut += f"; cut off while {what}" if what else ""
    if deadline.cancelled():
        return Cancelled(f"cancelled{cut}")
    return BudgetExhausted("wall", f"{deadline.elapsed_s():.1f} s of {deadline.seconds:g} s{cut}")
