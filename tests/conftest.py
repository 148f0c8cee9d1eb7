import fcntl
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The suite runs in two processes on two cores, each timing kernels while the other builds: confirmation rounds there
# spread by 50-8800% (measured). The tests check the flows (a kernel proposed, a PR opened); the unstable-measurement
# rule has its own tests (tests/runner/harness/test_confirm.py), which set their threshold explicitly.
os.environ.setdefault("FUSEBOT_UNSTABLE_SPREAD", "1000")


def _cuda_available() -> bool:
    try:
        import torch
    except ImportError:
        return False
    return torch.cuda.is_available()


def pytest_collection_modifyitems(config, items):
    if "exhaustive" not in (config.getoption("markexpr") or ""):
        for item in items:
            if "exhaustive" in item.keywords:
                item.add_marker(pytest.mark.skip(reason="exhaustive: run with pytest -m exhaustive"))
    if _cuda_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


def _lock_paths(config) -> tuple[Path, Path] | None:
    run = getattr(config, "workerinput", {}).get("testrunuid")  # the same in every process of one `pytest -n` run
    if run is None:
        return None
    base = Path(tempfile.gettempdir()) / f"fusebot-tests-{run}"
    return base.with_suffix(".gate"), base.with_suffix(".lock")


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    """A test marked `timing` asserts on speeds the CPU measures: under `pytest -n` it runs while the other processes
    wait between their tests, as a readers-writer lock with the writer first (the gate). Other tests share the lock.
    The hook wraps set-up and tear-down too, so a module fixture's builds never run beside a timing test."""
    paths = _lock_paths(item.config)
    if paths is None:
        yield
        return
    timing = item.get_closest_marker("timing") is not None
    with paths[0].open("a") as gate, paths[1].open("a") as lock:
        fcntl.flock(gate, fcntl.LOCK_EX)
        fcntl.flock(lock, fcntl.LOCK_EX if timing else fcntl.LOCK_SH)
        if not timing:
            fcntl.flock(gate, fcntl.LOCK_UN)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
            fcntl.flock(gate, fcntl.LOCK_UN)


def pytest_unconfigure(config):
    for path in _lock_paths(config) or ():
        path.unlink(missing_ok=True)


@pytest.fixture(scope="session", autouse=True)
def harness_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The harness's cache (FUSEBOT_CACHE_DIR: compiled kernels, torch.compile's inductor cache, load_inline
    extensions, the measured memory bandwidth), one per test session (per process under `pytest -n`), as one runner
    machine keeps it. Each entry is keyed by what was built or measured, so sharing it changes no verdict; it spares
    the tests building the same kernel, compiling the same module (a cold torch.compile of a small module is ~10 s on
    a 2-core CI machine) and measuring the same bandwidth again. It also keeps the tests off the user's own
    ~/.cache/fusebot. Tests that start processes with an environment of their own pass FUSEBOT_CACHE_DIR on."""
    path = tmp_path_factory.mktemp("harness-cache")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("FUSEBOT_CACHE_DIR", str(path))
        yield path
