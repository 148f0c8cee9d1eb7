"""Baselines measured once per problem, device, torch version and inputs, kept in the harness's cache directory
(FUSEBOT_CACHE_DIR): a rerun, or a second search of the same module, does not time eager and torch.compile again.

    baselines = cached_baselines(cache_dir, baseline_key(problem, info, config), measure)

The key hashes the module's source, every field of the problem that decides its inputs and constructor arguments
(shapes, dtype, factories), the device (GPU or CPU model, driver, CUDA), torch's version, and the timing settings
(the timer, the cores CPU timing is pinned to, whether torch.compile is a baseline). The confirmation still times both
baselines again beside the winner, in alternating rounds: no claim rests on a cached figure alone.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from pathlib import Path

from runner.contract import Baselines, ProblemSpec
from runner.harness.config import HarnessConfig, timing_cores
from runner.stored import stored

_INPUT_FIELDS = ("class_name", "inputs", "init_inputs", "init_args", "init_kwargs", "second_inputs", "input_shapes",
                 "dtype", "module")
_DEVICE_FIELDS = ("device", "gpu", "cpu", "driver", "cuda", "torch")


def baseline_key(problem: ProblemSpec, info: dict, config: HarnessConfig) -> str:
    """What decides a problem's baselines on this machine (`info`: the judge's answer to `init`)."""
    env = info.get("environment") or {}
    device = {k: env.get(k) for k in _DEVICE_FIELDS}
    parts = {
        "source": hashlib.sha256(str(info.get("source", "")).encode()).hexdigest(),
        "inputs": {k: getattr(problem, k, None) for k in _INPUT_FIELDS},
        "shape_sets": info.get("shape_sets", 1),
        "device": device,
        "timing": {"compile": config.compile_baseline, "timer": config.timer,
                   "cores": timing_cores(config) if device.get("device") == "cpu" else None},
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:32]


def cached_baselines(cache_dir: Path, key: str, measure: Callable[[], Baselines]) -> Baselines:
    """The baselines stored under `key`, else `measure()`'s, stored for the next run."""
    return stored(cache_dir / "baselines" / f"{key}.json", Baselines, measure, what="baselines")
