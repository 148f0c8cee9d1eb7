"""The harness's settings, and where and with which environment its child processes run."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from runner.harness.confirm import CONFIRM_ROUNDS, MIN_CONFIRM_ROUNDS
from runner.harness.sandbox import confined_env


@dataclass
class HarnessConfig:
    trials: int = 5  # on the problem's first shape; a second declared shape adds two more
    compile_baseline: bool = True
    # runner.harness.timing.TimerConfig fields (FUSEBOT_TIMER_MAX_SECONDS caps each measurement's seconds)
    timer: dict = field(default_factory=lambda: timer_setting(os.environ))
    init_timeout_s: float = 900.0  # a KernelBench candidate builds with load_inline inside init
    trial_timeout_s: float = 300.0
    time_timeout_s: float = 600.0
    memory_bytes: int = 32 << 30
    cpu_address_space_bytes: int | None = 64 << 30
    cache_dir: Path | None = None
    wall_check_ms: float = 100.0  # total wall time of the timer cross-check (CUDA)
    # the CPU cross-check's calls, at least (CPU time is accounted in 10 ms ticks; FUSEBOT_CPU_CHECK_MS overrides it)
    cpu_check_ms: float = field(default_factory=lambda: cpu_check_setting(os.environ))
    keep_workdirs: bool = False
    bandwidth_bytes_per_s: float | None = None  # a known ceiling instead of measuring one (e.g. 3.01e12 on the H100)
    # A problem moving more than this many bytes a call (inputs + outputs) is verified on 3 trials of its first
    # shape (factory, randn, factory: two distributions, and a stale result still shows) instead of `trials`: each
    # trial of a 7 GB problem costs seconds of copies, and one trial already checks billions of elements.
    large_io_bytes: int = 2 << 30
    # CPU backend: the cores the judge and every candidate's process run on (one torch thread per core); None: the
    # parent's own cores, less the lowest-numbered one where it has more than two (left to the parent and the host)
    cpu_cores: list[int] | None = None
    # confirmation: the spread (max - min over median) of the rounds' medians, of the candidate or of a baseline,
    # above which the result is an unstable measurement and nothing is claimed (docs/harness.md: how it was set)
    # (FUSEBOT_UNSTABLE_SPREAD overrides it, for a host whose noise is known and accepted)
    unstable_spread: float = field(default_factory=lambda: unstable_spread_setting(os.environ))


def _number_setting(environ: Mapping[str, str], name: str, default: float, least: float, strict: bool,
                    what: str) -> float:
    """The float in `name`, or `default` where unset; above `least` (at least it, unless `strict`), else ValueError."""
    raw = environ.get(name, "")
    if not raw:
        return default
    try:
        value = float(raw)
    except ValueError:
        value = float("nan")
    if not (value > least if strict else value >= least):
        raise ValueError(f"{name} must be {what}, not {raw!r}")
    return value


def unstable_spread_setting(environ: Mapping[str, str], default: float = 0.5) -> float:
    """FUSEBOT_UNSTABLE_SPREAD as a positive number (0.5: a 50% spread), validated where the harness is configured."""
    return _number_setting(environ, "FUSEBOT_UNSTABLE_SPREAD", default, 0.0, True,
                           "a positive number (0.5 is a 50% spread)")


def cpu_check_setting(environ: Mapping[str, str], default: float = 400.0) -> float:
    """FUSEBOT_CPU_CHECK_MS, the CPU cross-check's span in milliseconds: at least 100 (ten of the kernel's 10 ms CPU
    time ticks: an escape is a timer seeing under a tenth of the calls' cost), validated where the harness is
    configured."""
    return _number_setting(environ, "FUSEBOT_CPU_CHECK_MS", default, 100.0, False,
                           "a number of milliseconds, at least 100")


def confirm_rounds_setting(environ: Mapping[str, str]) -> int:
    """FUSEBOT_CONFIRM_ROUNDS, the alternating rounds a search's winner is confirmed in: a whole number, at least
    MIN_CONFIRM_ROUNDS (unset: CONFIRM_ROUNDS), for a host that needs its flows more than the extremes left out of five
    rounds; validated when a search starts."""
    raw = environ.get("FUSEBOT_CONFIRM_ROUNDS", "")
    if not raw:
        return CONFIRM_ROUNDS
    if not (raw.strip().isdigit() and int(raw) >= MIN_CONFIRM_ROUNDS):
        raise ValueError(f"FUSEBOT_CONFIRM_ROUNDS must be a whole number of rounds, at least {MIN_CONFIRM_ROUNDS}, "
                         f"not {raw!r}")
    return int(raw)


def timer_setting(environ: Mapping[str, str]) -> dict:
    """FUSEBOT_TIMER_MAX_SECONDS, the most seconds one measurement repeats its calls (after its least repetitions;
    unset: the timer's own 10 s), for a host that needs flows more than settled medians: validated where the harness
    is configured."""
    raw = environ.get("FUSEBOT_TIMER_MAX_SECONDS", "")
    if not raw:
        return {}
    return {"max_seconds": _number_setting(environ, "FUSEBOT_TIMER_MAX_SECONDS", 10.0, 0.0, True,
                                           "a positive number of seconds")}


def timing_cores(config: HarnessConfig) -> list[int]:
    """The cores CPU timing is pinned to."""
    if config.cpu_cores:
        return sorted(config.cpu_cores)
    cores = sorted(os.sched_getaffinity(0))
    return cores[1:] if len(cores) > 2 else cores


def scratch_root() -> Path:
    """Where working directories go: /dev/shm (memory) when it has room, else the temporary directory."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK) and shutil.disk_usage(shm).free > (8 << 30):
        return shm
    return Path(tempfile.gettempdir())


def child_env(workdir: Path, cache_dir: Path) -> dict[str, str]:
    """The environment of a child process: the sandbox's, with torch.compile's cache in the child's own directory
    (removed with its evaluation): a cache shared with other processes is one a hostile candidate writes compiled
    code into for them to load. The judge's is keyed by its problem's files (runner.harness.compile_cache).
    (`cache_dir` holds the builds and KernelBench extensions, keyed by their sources.)"""
    return confined_env(workdir)  # (its TORCHINDUCTOR_CACHE_DIR is in `workdir`)
