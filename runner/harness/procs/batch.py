"""The parent-clocked batch: back-to-back calls whose time the parent takes with its own clock.

In the candidate's process (`run`): `calls` calls, each on fresh inputs (the timing's inputs scaled by call k's
factor, k counting from the `first` the parent chose), each output fingerprinted (runner.harness.fingerprint) with
the weights of the seed the parent drew for this batch. The fingerprints come back with the reply; only then does
the parent draw which calls the judge checks, so every call must have done its work inside the parent's clock.

In the judge (`Steps`): the same fresh-input steps, fingerprints and reply, of outputs of the same sizes, without the
call: what the batch costs besides the calls, timed by the parent in a process the candidate never touched (its
inputs are made once per cross-check, before the first request the parent times).
The judge (`check`) reruns the reference and the oracle on a drawn call's inputs and checks its fingerprint.
"""

from __future__ import annotations

import torch

from runner.harness import fingerprint, verify
from runner.harness.procs.calls import FreshInputs, call_scale

_sync = torch.cuda.synchronize


def _prints(flat: list, seed: int) -> list:
    return [fingerprint.of(t, seed) if isinstance(t, torch.Tensor) else None for t in flat]


def _listed(prints: list, device: str) -> list:
    if device.startswith("cuda"):
        _sync()
    return [[p.tolist() if p is not None else None for p in call] for call in prints]


def run(capture, fresh: FreshInputs, msg: dict, device: str) -> dict:
    seed = int(msg["weights_seed"])
    fresh.k = int(msg["first"]) - 1
    prints = []
    for _ in range(int(msg["calls"])):
        fresh.next()
        capture()
        flat, _ = verify.flatten(capture.out)
        prints.append(_prints(flat, seed))
    return {"fingerprints": _listed(prints, device)}


class Steps:
    """The judge's side of a batch: the first shape's inputs and outputs of the reference's sizes, made once per
    cross-check (outside the requests the parent times), then each `run` the batch's steps without the call."""

    def __init__(self, base: list, specs: list[dict], seed: int, device: str):
        self.fresh = FreshInputs(base, seed)
        self.outs = [torch.zeros(s["shape"], dtype=verify.DTYPE_NAMES[s["dtype"]], device=device) for s in specs]
        self.device = device

    def run(self, msg: dict) -> dict:
        """What the candidate's process does besides its calls, reply included (the same fingerprints, of zeros)."""
        seed = int(msg["weights_seed"])
        self.fresh.k = int(msg.get("first", 1)) - 1
        prints = []
        for _ in range(int(msg["calls"])):
            self.fresh.next()
            flat, _ = verify.flatten(self.outs[0] if len(self.outs) == 1 else tuple(self.outs))
            prints.append(_prints(flat, seed))
        return {"fingerprints": _listed(prints, self.device)}


def check(st, msg: dict, base: list, run_reference, oracle_outputs) -> list[str]:
    """Reasons (timer-escape) for each drawn call whose fingerprints are not those of outputs within the rule."""
    reasons: list[str] = []
    for record in msg["checks"]:
        k = int(record["call"])
        s = call_scale(int(msg["seed"]), k)
        inputs = [torch.mul(x, s) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in base]
        flat, _ = run_reference(st, inputs)
        oracles, _ = oracle_outputs(st.oracle, inputs, flat)
        got = record.get("fingerprint")
        if not isinstance(got, list) or len(got) != len(flat):
            reasons.append(f"timer-escape: back-to-back call {k} reported no fingerprint of each of its outputs")
            break
        for i, (r, g) in enumerate(zip(flat, got, strict=True)):
            if not isinstance(r, torch.Tensor):
                continue
            atol, rtol = verify.tolerance_for(r.dtype, st.problem.spec.atol, st.problem.spec.rtol)
            atol = verify.effective_atol(atol, verify.magnitude(r))
            why = fingerprint.mismatch(g, fingerprint.expected(r, oracles[i], atol, rtol, int(record["weights_seed"])))
            if why:
                reasons.append(f"timer-escape: output {i} of back-to-back call {k}, timed by the parent's clock, is "
                               f"not the reference's on the same inputs: {why}: the call did not do its work")
                break
        if reasons:
            break
    return reasons
