"""What a candidate is run on: the secret its seeds come from, and the trials of one verification.

The parent process holds the secret; a child only ever sees the seeds derived from it, one per trial, so that no
candidate can predict the inputs of a trial it has not yet been given.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets


class Seeds:
    """Seeds derived from a secret drawn once per evaluator: the same label gives the same seed within it."""

    def __init__(self) -> None:
        self._secret = secrets.token_bytes(32)
        self.counter = 0  # trials and processes numbered across the evaluator's life

    def seed(self, label: str) -> int:
        digest = hmac.new(self._secret, label.encode(), hashlib.sha256).digest()
        return int.from_bytes(digest[:6], "little")

    def next_number(self) -> int:
        self.counter += 1
        return self.counter


def trial_plan(seeds: Seeds, tag: str, *, trials: int, shape_sets: int, large: bool, randn_trials: bool) -> list[dict]:
    """The trials of one verification: `trials` (at least 5) on the problem's first shape, alternating its own
    inputs and a randn draw of secret scale and offset (3 only for a `large` problem), the last of them with edge
    values put into its inputs (runner.harness.problem.edge_values) where the problem takes any values
    (`randn_trials`), the one before it (not for a `large` problem) with NaN and both infinities
    (problem.nonfinite_values), then two on its second shape where it declares one. Each trial gets its own number and seed."""
    plan = []
    for i in range(3 if large else max(trials, 5)):
        randn = None
        if randn_trials and i % 2 == 1:
            scale = 0.5 + 3.5 * (seeds.seed(f"{tag}/scale{i}") % 1000) / 1000
            offset = -1.0 + 2.0 * (seeds.seed(f"{tag}/offset{i}") % 1000) / 1000
            randn = [scale, offset]
        plan.append({"shape_set": 0, "randn": randn})
    if randn_trials:
        plan[-1]["edge"] = True
        if not large:
            plan[-2]["nonfinite"] = True
    if shape_sets > 1:
        plan += [{"shape_set": 1, "randn": None}, {"shape_set": 1, "randn": plan[1]["randn"]}]
    for p in plan:
        p["trial"] = seeds.next_number()
        p["seed"] = seeds.seed(f"{tag}/trial{p['trial']}")
    return plan
