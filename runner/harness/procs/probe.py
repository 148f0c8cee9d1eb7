"""A known-good computation in a fresh process: whether the machine itself still works.

When a candidate's process (or the judge while a candidate's process is alive) fails in a way that could be the
machine's, the parent runs this. If it succeeds, the failure was the candidate's (a verdict); if it fails, the
machine is broken (MachineError).

Commands (JSON): probe, exit.
"""

from __future__ import annotations

import torch

from runner.harness.procs.process import serve


def probe(st: object, msg: dict) -> dict:
    device = msg["device"]
    if device.startswith("cuda"):
        torch.cuda.init()
    n = 1 << 16
    x = torch.arange(n, dtype=torch.float64, device=device)
    total = float((x * 2.0 + 1.0).sum())
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    expected = float(n) * float(n)  # sum of 2i + 1 for i < n
    if total != expected:
        return {"ok": False, "error": f"2i+1 summed over {n} values gave {total}, not {expected}"}
    return {"ok": True}


if __name__ == "__main__":
    serve({"probe": probe}, object())
