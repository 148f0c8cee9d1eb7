"""Confirmation: the winner of a search timed again, in a fresh process, against both baselines in alternating
rounds, so that a claim can require it to win in every round.

Times of one kernel measured in different processes differ by more than the gap between many candidates (on the
H100: 0.234 and 0.277 ms for the same source), so the fastest of a search is partly the luckiest.
"""

from __future__ import annotations

import statistics

from runner.contract import Baselines, Confirmation, Timing
from runner.harness.timing import summarize


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
