"""Confirmation: the winner of a search timed again, in a fresh process, against both baselines in alternating
rounds, so that a claim can require it to win in every round (of five or more, all but the highest and lowest).

Times of one kernel measured in different processes differ by more than the gap between many candidates (on the
H100: 0.234 and 0.277 ms for the same source), so the fastest of a search is partly the luckiest.
"""

from __future__ import annotations

import statistics

from runner.contract import Baselines, Confirmation, Timing
from runner.harness.timing import summarize

# A search's winner is timed in this many rounds (FUSEBOT_CONFIRM_ROUNDS overrides it: runner.harness.config); five
# or more let a claim leave out the highest and the lowest round (`agreeing`).
CONFIRM_ROUNDS = 5
# The fewest rounds a confirmation runs, under a deadline too: a claim needs rounds that agree (one round has no spread
# to judge).
MIN_CONFIRM_ROUNDS = 2


def pool(ts: list[Timing]) -> Timing:
    """One timing of every sample of several rounds."""
    hosts = [t.host_ms for t in ts if t.host_ms is not None]
    return summarize([x for t in ts for x in t.samples_ms], clock=ts[0].clock, l2_flushed=ts[0].l2_flushed,
                     host_ms=statistics.median(hosts) if hosts else None,
                     lead_ms=max(t.lead_ms for t in ts)).model_copy(update={"call": ts[0].call})


def confirmation(cand: list[Timing], rounds: list[Baselines]) -> tuple[Timing, Baselines, Confirmation]:
    """The pooled timing and baselines of alternating rounds, and each round's medians and speedups."""
    eager = [b.eager for b in rounds]
    comp = [b.compile for b in rounds if b.compile is not None]
    conf = Confirmation(
        rounds=len(cand), candidate_ms=[t.median_ms for t in cand], eager_ms=[t.median_ms for t in eager],
        compile_ms=[t.median_ms for t in comp],
        speedup_vs_eager=[e.median_ms / c.median_ms for e, c in zip(eager, cand, strict=True)],
        speedup_vs_compile=[k.median_ms / c.median_ms for k, c in zip(comp, cand, strict=True)] if comp else [],
    )
    return pool(cand), Baselines(eager=pool(eager), compile=pool(comp) if comp else None), conf


def spread(values: list[float]) -> float:
    """(max - min) / median of per-round medians: how far apart the rounds landed."""
    return (max(values) - min(values)) / statistics.median(values) if values else 0.0


# The least gain over the faster baseline a claim needs, whatever the rounds say (docs/pull-requests.md, "The minimum
# effect"): on the H100, kernels doing the same memory-bound work as torch.compile at the roofline floor (where nothing
# can be faster) measured 0.98-1.02x over five alternating rounds (bench/results/h100-catalog).
MIN_EFFECT = 0.03


EXTREMES = " (of five or more, the highest and the lowest left out)"  # how `won_every_round` reads


def agreeing(conf: Confirmation) -> list[float]:
    """The rounds' speedups over the faster baseline, sorted, leaving out the highest and the lowest when there are
    five or more: one round a busy host preempted moves the extremes, not the comparison (the unstable-measurement
    rule judges the rounds' own spread)."""
    speedups = sorted(conf.speedup_vs_faster())
    return speedups[1:-1] if len(speedups) >= 5 else speedups


def won_every_round(conf: Confirmation) -> bool:
    """Faster than the faster baseline in every round that agrees (`agreeing`)."""
    return min(agreeing(conf)) > 1.0


def margin(conf: Confirmation, floor: float = MIN_EFFECT) -> float:
    """How much faster than the faster baseline a kernel must be for a claim, as a fraction (0.03: 3%): the larger of
    `floor` and the spread of the agreeing rounds' speedups over the faster baseline (what the same comparison
    moved by)."""
    return max(floor, spread(agreeing(conf)))


def spread_text(conf: Confirmation, what: str = "the kernel") -> str:
    """Each contestant's range of round medians and its spread; `what` names the candidate ("the PyTorch rewrite")."""
    parts = [f"{what} {min(conf.candidate_ms):.4g}-{max(conf.candidate_ms):.4g} ms "
             f"({100 * spread(conf.candidate_ms):.0f}%)",
             f"eager {min(conf.eager_ms):.4g}-{max(conf.eager_ms):.4g} ms ({100 * spread(conf.eager_ms):.0f}%)"]
    if conf.compile_ms:
        parts.append(f"torch.compile {min(conf.compile_ms):.4g}-{max(conf.compile_ms):.4g} ms "
                     f"({100 * spread(conf.compile_ms):.0f}%)")
    return f"over {conf.rounds} rounds: " + ", ".join(parts)


def unstable(conf: Confirmation, threshold: float, what: str = "the kernel") -> str | None:
    """Why the rounds do not agree enough for a claim (a spread above `threshold` of the candidate's or a baseline's
    round medians), or None."""
    worst = max(spread(conf.candidate_ms), spread(conf.eager_ms), spread(conf.compile_ms))
    if conf.rounds > 1 and worst > threshold:
        return (f"the rounds' medians spread by up to {100 * worst:.0f}% (more than {100 * threshold:.0f}%): "
                f"{spread_text(conf, what)}; the host is too noisy for a figure that holds (pin the runner, or run it "
                "on an idle host)")
    return None
