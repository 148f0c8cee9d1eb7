"""What a search proposes: the best kernel, the best PyTorch rewrite, or nothing. Pure, but for `confirm_finalists`.

    kernel, rewrite = finalists(result)                     # the fastest verified of each kind
    k, w = claim(kernel, confirmed), claim(rewrite, confirmed_rewrite)
    chosen, why = choose(k, w)

A claim is eligible when its confirmation (alternating rounds against both baselines, runner.harness.confirm) won
every round and its speedup over the faster baseline clears the minimum effect: the larger of a fixed floor and the
spread of the rounds' speedups (`runner.harness.confirm.margin`; docs/pull-requests.md, "The minimum effect"). When
the rewrite is eligible, the kernel is proposed over it only when it is faster in every round (its slowest agreeing
round beats the rewrite's fastest) and, pooled, by more than the margin and by at least KERNEL_OVER_REWRITE: a few
lines of PyTorch in the user's own module are a smaller change to review than a kernel, a drop-in and its binary.
"""

from __future__ import annotations

import inspect
import logging
from collections.abc import Callable
from dataclasses import dataclass

from runner.contract import Candidate, Confirmation, Progress, Verdict, faster_baseline
from runner.harness.confirm import EXTREMES, MIN_CONFIRM_ROUNDS, MIN_EFFECT, agreeing, margin, spread, won_every_round
from runner.search.deadline import Cancelled, Deadline
from runner.search.loop import SearchResult
from runner.search.types import Attempt

log = logging.getLogger(__name__)

# How much faster than an eligible PyTorch rewrite a kernel must be to be proposed instead: a reviewer does not take
# device code for a gain inside the noise (on the H200, RowGain's kernel and its one-line rewrite were 5% apart while
# the kernel's own rounds spread 13-17%).
KERNEL_OVER_REWRITE = 0.10

KERNEL, REWRITE = "kernel", "rewrite"

# A claim's speed verdict, apart from its correctness (a table's column beside "verified").
SPEED = {
    "faster": "faster than both baselines in every round, by the minimum effect",
    "slower": "slower than the faster baseline in every round",
    "unprovable": "faster in every round, but the host was too noisy to prove it",
    "noisy": "the rounds spread too far for any figure",
    "not faster": "not faster in every round",
    "below margin": "faster, but under the minimum effect",
    "failed": "failed when verified and timed again",
    "degenerate": "the output does not depend on the input",
}
REWRITE_LABEL = "PyTorch rewrite"
# The speed verdicts of a claim whose rounds spread too far for a figure: faster than a kernel, or not, is unknown.
NO_FIGURE = frozenset({"unprovable", "noisy"})


def is_rewrite(candidate: Candidate | None) -> bool:
    """A source rewrite of the user's module (runner/proposers/rewrite/): its `rewrite` holds the new file."""
    return bool(getattr(candidate, "rewrite", ""))


def finalists(result: SearchResult) -> tuple[Attempt | None, Attempt | None]:
    """(the fastest verified kernel, the fastest verified PyTorch rewrite): the beam first, then the whole archive."""
    ranked = [*result.beam, *result.history.accepted()]
    kernel = next((a for a in ranked if not is_rewrite(a.candidate)), None)
    rewrite = next((a for a in ranked if is_rewrite(a.candidate)), None)
    return kernel, rewrite


def confirm_finalists(result: SearchResult, evaluator: object, rounds: int,
                      progress: Callable[[Progress], None] | None = None,
                      deadline: Deadline | None = None) -> tuple[Verdict | None, Verdict | None]:
    """Each finalist timed again against both baselines in alternating rounds (Evaluator.confirm): the fastest of many
    noisy measurements is partly the luckiest. (None, None) for an evaluator that cannot confirm. Each round is
    reported as it ends. Under a `deadline` the faster finalist goes first, the finalists share the time left, a
    finalist's rounds stop (after MIN_CONFIRM_ROUNDS) when the next would not fit in its share, and the slower
    finalist is not confirmed (None) when less time is left than the faster one's confirmation took."""
    confirm = getattr(evaluator, "confirm", None)
    todo = [(what, a) for what, a in zip((KERNEL, REWRITE), finalists(result), strict=True)
            if confirm is not None and a is not None and a.candidate is not None]
    todo.sort(key=lambda x: x[1].median_ms if x[1].median_ms is not None else float("inf"))  # the faster first
    out: dict[str, Verdict] = {}
    took_s = 0.0  # what the previous finalist's confirmation took
    for k, (what, a) in enumerate(todo):
        if deadline is not None and deadline.cancelled():
            break
        if deadline is not None and k and deadline.left_s() < took_s:
            log.info("the best %s is not confirmed: %.0f s of the budget are left, and confirming the best %s took "
                     "%.0f s", what, max(0.0, deadline.left_s()), todo[k - 1][0], took_s)
            break
        started_s = deadline.elapsed_s() if deadline is not None else 0.0
        if progress:
            progress(result.progress.model_copy(update={"message": f"confirming the best {what} against the baselines"}))
        end_s = None if deadline is None else deadline.elapsed_s() + max(0.0, deadline.left_s()) / (len(todo) - k)
        reporter = _RoundReporter(what, rounds, result.progress, progress, deadline, end_s)
        takes = "on_round" in inspect.signature(confirm).parameters  # type: ignore[arg-type]
        out[what] = confirm(a.candidate, rounds=rounds, **({"on_round": reporter} if takes else {}))  # type: ignore[misc]
        took_s = deadline.elapsed_s() - started_s if deadline is not None else 0.0
    if deadline is not None and deadline.cancelled():
        raise Cancelled("cancelled during the confirmation")
    return out.get(KERNEL), out.get(REWRITE)


class _RoundReporter:
    """Logs (and shows as progress) each confirmation round as it ends; says whether another round fits in the
    finalist's share of the deadline (`end_s`, seconds from the deadline's start), at the seconds per round so far."""

    def __init__(self, what: str, rounds: int, base: Progress, progress: Callable[[Progress], None] | None,
                 deadline: Deadline | None, end_s: float | None):
        self.what, self.rounds, self.base, self.progress, self.deadline, self.end_s = \
            what, rounds, base, progress, deadline, end_s
        self.start_s = deadline.elapsed_s() if deadline is not None else 0.0

    def __call__(self, n: int, candidate_ms: float, eager_ms: float, compile_ms: float | None) -> bool:
        line = (f"confirming the best {self.what}: round {n}/{self.rounds}: {candidate_ms:.4g} ms against eager "
                f"{eager_ms:.4g} ms" + (f", torch.compile {compile_ms:.4g} ms" if compile_ms is not None else ""))
        log.info("%s", line)
        if self.progress:
            self.progress(self.base.model_copy(update={"message": line}))
        d = self.deadline
        if d is not None and d.cancelled():
            return False
        if d is None or self.end_s is None or n < MIN_CONFIRM_ROUNDS:
            return True
        now_s = d.elapsed_s()
        return now_s + (now_s - self.start_s) / n <= self.end_s


@dataclass
class Claim:
    """One finalist after its confirmation: whether it may be proposed, and the sentence that says so or why not."""

    attempt: Attempt  # its verdict: the search's trials, then the confirmation's trials, timing and rounds
    eligible: bool
    message: str
    speedup: float | None = None  # over the faster baseline, pooled over the rounds
    margin: float | None = None  # the minimum effect it was held to (0.03: 3%)
    baseline: str = ""  # "eager" or "torch.compile"
    speed: str = ""  # the speed verdict in a word or two (SPEED), apart from correctness

    @property
    def kind(self) -> str:
        return REWRITE if is_rewrite(self.attempt.candidate) else KERNEL


DEGENERATE = ("the problem is degenerate (its output does not depend on its input): no speedup on it is reportable, "
              "no kernel is proposed")


def claim(best: Attempt, v: Verdict) -> Claim:
    """`best` judged by its confirmation `v`: eligible only when verified again, won every round and cleared the
    margin."""
    if best.verdict is not None:  # the search's trials (every shape and distribution), then the confirmation's
        v = v.model_copy(update={"trials": [*best.verdict.trials, *v.trials]})
    best = best.model_copy(update={"verdict": v})
    what = REWRITE_LABEL if is_rewrite(best.candidate) else "kernel"
    c = v.confirmation
    fb = faster_baseline(v.baselines)
    if c is not None and v.timing is not None and fb is not None and _only_unstable(v):
        speed, message = _unprovable(what, v, c, fb[0])  # the pooled figure kept, as measured, for `choose` alone
        return Claim(best, False, message, fb[1].median_ms / v.timing.median_ms, margin(c), fb[0], speed)
    if not v.accepted or c is None or v.timing is None or fb is None:
        return Claim(best, False, f"the fastest {what} failed when verified again: " + "; ".join(v.reasons[:2]),
                     speed="failed")
    if v.degenerate:
        return Claim(best, False, DEGENERATE, speed="degenerate")
    faster, base_ms = fb[0], fb[1].median_ms
    per_round = c.speedup_vs_faster()
    m = margin(c)
    s = base_ms / v.timing.median_ms
    rounds = f"{min(per_round):.2f}-{max(per_round):.2f}x over {c.rounds} alternating rounds"
    figures = f"{v.timing.median_ms:.4g} ms against {base_ms:.4g} ms ({rounds})"
    if not won_every_round(c):
        message = (f"nothing beat {faster} in every round{EXTREMES if c.rounds >= 5 else ''}: the fastest verified "
                   f"{what} took {figures}; not proposed")
        return Claim(best, False, message, s, m, faster, "not faster")
    if s < 1.0 + m:
        message = (f"below the minimum effect: the fastest verified {what} is {s:.2f}x faster than {faster}, under the "
                   f"{100 * m:.0f}% margin (the larger of a {100 * MIN_EFFECT:.0f}% floor and the rounds' "
                   f"{100 * spread(agreeing(c)):.0f}% spread); {figures}; not proposed")
        return Claim(best, False, message, s, m, faster, "below margin")
    message = (f"{v.timing.median_ms:.4g} ms, {s:.2f}x faster than {faster} ({base_ms:.4g} ms; {rounds}; margin "
               f"{100 * m:.0f}%)")
    return Claim(best, True, message, s, m, faster, "faster")


def _only_unstable(v: Verdict) -> bool:
    """Verified again and timed, and refused only because its rounds spread too far for a figure."""
    return bool(v.reasons) and all(r.startswith("unstable-measurement") for r in v.reasons)


def _unprovable(what: str, v: Verdict, c: Confirmation, faster: str) -> tuple[str, str]:
    """(the SPEED word, the message) of a confirmation whose rounds spread too far: slower in every round, faster in
    every round but not provably, or neither."""
    per_round = c.speedup_vs_faster()
    rounds = f"{min(per_round):.2f}-{max(per_round):.2f}x against {faster} over {c.rounds} rounds"
    why = v.reasons[0].removeprefix("unstable-measurement: ")
    if max(per_round) < 1.0:
        return "slower", f"slower: the fastest verified {what} lost every round ({rounds}); not proposed"
    if min(per_round) > 1.0:
        return "unprovable", (f"faster but not provable on this host: the fastest verified {what} won every round "
                              f"({rounds}), but {why}; rerun on an idle host; not proposed")
    return "noisy", f"not provable on this host: the fastest verified {what} measured {rounds}, and {why}; not proposed"


def choose(kernel: Claim | None, rewrite: Claim | None) -> tuple[Claim | None, str]:
    """(the claim to propose, or the one that says why nothing is; why this one and not the other, "" when there
    was no other)."""
    if rewrite is None:
        return kernel, ""
    if kernel is None:
        return rewrite, "" if not rewrite.eligible else "no kernel was verified: the PyTorch rewrite is proposed"
    m = max(kernel.margin or MIN_EFFECT, rewrite.margin or MIN_EFFECT, KERNEL_OVER_REWRITE)
    ks, ws = kernel.speedup, rewrite.speedup
    if rewrite.eligible and not kernel.eligible:
        return rewrite, (f"the PyTorch rewrite cleared the minimum effect and no kernel did ({_x(ks)} over the faster "
                         "baseline): the rewrite is proposed")
    # the least a kernel must gain over a rewrite is not called a margin: a PR states one margin, its claim's
    over = f"{100 * m:.0f}% (what a kernel must gain over a rewrite: at least {100 * KERNEL_OVER_REWRITE:.0f}%)"
    if rewrite.eligible and not _kernel_clearly_faster(kernel, rewrite, m):
        return rewrite, (f"the best kernel ({_x(ks)}) is not faster than the PyTorch rewrite ({_x(ws)}) in every round "
                         f"and by more than {over}: the simpler change is proposed, no kernel")
    if kernel.eligible and rewrite.speed in NO_FIGURE and not _kernel_clearly_faster(kernel, rewrite, m):
        return rewrite, (f"the best kernel ({_x(ks)}) is not faster than the PyTorch rewrite ({_x(ws)}, rounds too "
                         f"spread for a figure) in every round and by more than {over}: no kernel is proposed over a "
                         "simpler change that may be as fast; rerun on an idle host")
    if kernel.eligible:
        return kernel, (f"the best kernel ({_x(ks)}) beats the PyTorch rewrite ({_x(ws)}) in every round and by more "
                        f"than {over}" if rewrite.eligible else
                        f"the PyTorch rewrite is not proposed ({rewrite.speed}: {SPEED.get(rewrite.speed, '')})"
                        ) + ": the kernel is proposed"
    return kernel, "neither the best kernel nor the PyTorch rewrite cleared the minimum effect"


def _kernel_clearly_faster(kernel: Claim, rewrite: Claim, m: float) -> bool:
    """The kernel's pooled speedup over the rewrite's by more than `m`, and its slowest agreeing round faster than the
    rewrite's fastest (each round's speedup is over that round's own faster baseline)."""
    ks, ws = kernel.speedup, rewrite.speedup
    kc, wc = kernel.attempt.verdict.confirmation, rewrite.attempt.verdict.confirmation
    if ks is None or ws is None or kc is None or wc is None:
        return False
    return ks > ws * (1.0 + m) and min(agreeing(kc)) > max(agreeing(wc))


def _x(s: float | None) -> str:
    return f"{s:.2f}x" if s is not None else "not timed"
