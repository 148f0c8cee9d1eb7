"""Whether a search can pay: where the faster baseline already runs within the minimum effect of the memory floor
(bytes moved / the device's copy rate), no kernel that moves the same bytes can beat it by that effect, so the search
is not run and the outcome says so with the figure. A kernel that skips work (a causal or padding mask's elements,
runner.catalog.skipping) moves fewer bytes than the floor counts, so a problem that allows skipping is searched."""

from __future__ import annotations

from runner.contract import Baselines, Roofline
from runner.harness.confirm import MIN_EFFECT
from runner.search.loop import SearchResult
from runner.search.types import History


def at_floor(baselines: Baselines | None, roofline: Roofline | None, *, skips: bool,
             min_effect: float = MIN_EFFECT) -> str | None:
    """The reason to spend no search (None: search): the faster baseline's median within `min_effect` of the floor
    (floor_ms * (1 + min_effect) or faster) and no skipping applies."""
    if skips or roofline is None or baselines is None or roofline.floor_ms <= 0:
        return None
    timed = [(t.median_ms, name) for name, t in (("eager", baselines.eager), ("torch.compile", baselines.compile))
             if t is not None and t.median_ms > 0]
    if not timed:
        return None
    best_ms, name = min(timed)
    if best_ms > roofline.floor_ms * (1 + min_effect):
        return None
    return (f"{name} runs at {100 * roofline.floor_ms / best_ms:.0f}% of the memory floor ({best_ms:.4g} ms against "
            f"{roofline.floor_ms:.4g} ms for {roofline.bytes_moved} bytes): no kernel can beat it by the minimum effect "
            f"({100 * min_effect:.0f}%), so no search was run")


def no_search(reason: str) -> SearchResult:
    """The result of a search not run: no attempt, stopped for `reason`."""
    return SearchResult(history=History(), beam=[], stop_reason=reason, rounds=0, tokens_used=0, cost_usd=0.0,
                        gpu_seconds=0.0, wall_seconds=0.0, candidates=0)
