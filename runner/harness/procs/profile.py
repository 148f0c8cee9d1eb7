"""Which GPU kernels a call launched, and on which streams, read from the profiler's trace."""

from __future__ import annotations

import json
import re
import time
from collections.abc import Callable
from pathlib import Path

# `__global__ [qualifiers] void [qualifiers] name(`: CUDA accepts __launch_bounds__ and the inline/static qualifiers on
# either side of `void`.
_QUAL = r"(?:__launch_bounds__\s*\([^)]*\)\s*|static\s+|inline\s+|__inline__\s+|__forceinline__\s+|__noinline__\s+)*"
_GLOBAL = re.compile(r"__global__\s+" + _QUAL + r"void\s+" + _QUAL + r"(\w+)\s*\(")


def declared_kernels(sources: dict[str, str]) -> list[str]:
    """Names of the __global__ functions a candidate's sources define."""
    names: list[str] = []
    for text in sources.values():
        names += _GLOBAL.findall(text)
    return sorted(set(names))


def profile_kernels(fn: Callable[[], object], trace_path: Path) -> tuple[object, list[dict], int | None]:
    """Run `fn` once under the profiler. Returns its result, the kernels it launched ({name, stream}) and the stream
    of a marker op the harness launched on the caller's current stream just before `fn`."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    marker = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA, ProfilerActivity.CPU]) as prof:
        marker.fill_(7.0)  # a kernel of our own, on the current stream
        result = fn()
        torch.cuda.synchronize()
    prof.export_chrome_trace(str(trace_path))
    events = json.loads(Path(trace_path).read_text()).get("traceEvents", [])
    raw = sorted((e for e in events if e.get("cat") == "kernel"), key=lambda e: e.get("ts", 0))
    kernels = [{"name": e.get("name", ""), "stream": (e.get("args") or {}).get("stream")} for e in raw]
    marker_stream = None
    for k in kernels:
        if "fill" in k["name"].lower():
            marker_stream = k["stream"]
            break
    if marker_stream is not None:
        # Drop the marker itself (the first fill kernel on that stream).
        for i, k in enumerate(kernels):
            if "fill" in k["name"].lower() and k["stream"] == marker_stream:
                del kernels[i]
                break
    return result, kernels, marker_stream


class Phases(dict):
    """Seconds of each step of a process's start (`init`, `warm`), for the parent's log: where a load's time goes.
    `imported_at`: the wall-clock time the process's imports were done."""

    def __init__(self, imported_at: float) -> None:
        super().__init__(imported_at=imported_at)
        self._t = time.monotonic()

    def lap(self, name: str) -> None:
        now = time.monotonic()
        self[f"{name}_s"] = round(now - self._t, 3)
        self._t = now
