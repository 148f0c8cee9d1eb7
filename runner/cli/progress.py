"""The progress of `fusebot optimize`: round, candidates built / verified / rejected, best speedup over the faster
baseline. On a terminal, one live line drawn by rich on stderr; elsewhere (CI, a pipe, a file), a plain log line each
time something changes, so the log reads line by line and nothing runs into the next message."""

from __future__ import annotations

import logging

from rich.console import Console
from rich.live import Live
from rich.text import Text

from runner.contract import Progress

log = logging.getLogger("fusebot.progress")


def started(p: Progress) -> bool:
    """Whether the search has begun: before it, the counts are all zero and the message (the budget, the baselines
    being timed) is the whole news."""
    return bool(p.round or p.built or p.verified or p.rejected or not p.message)


# The search's best is one process's timing of the fastest of many candidates: the confirmation's rounds decide the
# figure the report gives (and may refuse it), so the live figure says it is not that one.
UNCONFIRMED = "unconfirmed"


def progress_line(p: Progress, rounds: int) -> str:
    """`round 2/3: built 5, verified 3, rejected 2, best 1.42x unconfirmed (confirming ...)`; before the search, its
    message."""
    if not started(p):
        return p.message
    best = f"{p.best_speedup:.2f}x {UNCONFIRMED}" if p.best_speedup is not None else "-"
    text = f"round {p.round}/{rounds}: built {p.built}, verified {p.verified}, rejected {p.rejected}, best {best}"
    return text + (f" ({p.message})" if p.message else "")


class ProgressView:
    """A callable for `optimize_problem(progress=...)`, used as a context manager around the search."""

    def __init__(self, console: Console, rounds: int, *, live: bool | None = None):
        self.rounds = rounds
        self.last: Progress | None = None
        self.live = Live(self._text(Progress(message="starting")), console=console, refresh_per_second=4, transient=False) \
            if (console.is_terminal if live is None else live) else None
        if self.live is None:
            log.setLevel(logging.INFO)  # the progress is shown whatever the log level; -v adds the rest

    def _text(self, p: Progress) -> Text:
        if not started(p):
            return Text.assemble(("fusebot ", "bold"), p.message)
        best = f"{p.best_speedup:.2f}x" if p.best_speedup is not None else "-"
        text = Text.assemble(("fusebot ", "bold"), f"round {p.round}/{self.rounds}  built {p.built}  ",
                             (f"verified {p.verified}", "green"), "  ", (f"rejected {p.rejected}", "red"),
                             "  best ", (best, "bold cyan"), f" {UNCONFIRMED}" if p.best_speedup is not None else "")
        if p.message:
            text.append(f"  ({p.message})")
        return text

    def __enter__(self) -> ProgressView:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.live is not None:
            self.live.__exit__(*exc)

    def __call__(self, p: Progress) -> None:
        if p == self.last:
            return
        self.last = p.model_copy()
        if self.live is not None:
            self.live.update(self._text(p))
        else:
            log.info("%s", progress_line(p, self.rounds))
