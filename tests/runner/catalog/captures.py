"""The catalog's captures (runner/catalog/capture.py's `capture_sources`: torch.export in one confined child process)
kept for the test run in its harness cache (tests/conftest.py), one file per source, keyed by the source's text and
the environment's switches a problem reads when captured (SWITCHES): the
test files that capture the same fixture problems (tests/runner/catalog, tests/bench) start one capture process for
what no file captured before them, in either of `pytest -n`'s processes. A capture that failed as a process (it timed
out, or wrote no graph) is never kept. tests/runner/catalog/test_capture.py tests the capture itself: it captures
every time and keeps what it captured here."""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from pathlib import Path

from runner.catalog.capture import CGraph, capture_sources

_PROCESS_FAILURES = ("capture failed: ", "capture timed out")
# REALWORLD_SUITE_SMALL: bench/suites/realworld's problems at CI sizes; CUDA_VISIBLE_DEVICES: the capture's default
SWITCHES = ("REALWORLD_SUITE_SMALL", "CUDA_VISIBLE_DEVICES")


def _folder() -> Path | None:
    cache = os.environ.get("FUSEBOT_CACHE_DIR")
    return Path(cache) / "test-captures" if cache else None


def _path(folder: Path, source: str) -> Path:
    switches = "".join(f"\0{name}={os.environ.get(name, '')}" for name in SWITCHES)
    return folder / f"{hashlib.sha256((source + switches).encode()).hexdigest()[:32]}.json"


def keep(sources: list[str], graphs: list[CGraph]) -> None:
    """Keep each source's graph for the rest of the run (not a process's failure)."""
    folder = _folder()
    if folder is None:
        return
    folder.mkdir(parents=True, exist_ok=True)
    for source, graph in zip(sources, graphs, strict=True):
        if graph.unsupported and graph.unsupported.startswith(_PROCESS_FAILURES):
            continue
        with tempfile.NamedTemporaryFile("w", dir=folder, suffix=".tmp", delete=False) as f:
            f.write(json.dumps(graph.model_dump()))  # as the capture writes it (-inf masks stay -Infinity)
        os.replace(f.name, _path(folder, source))  # whole or not at all: the other process may be reading


def captured(sources: list[str], *, timeout_s: float = 300.0) -> list[CGraph]:
    """`capture_sources(sources)`, the graphs kept this run read instead of captured again."""
    folder = _folder()
    found: dict[int, CGraph] = {}
    if folder is not None:
        for k, source in enumerate(sources):
            path = _path(folder, source)
            if path.exists():
                found[k] = CGraph.model_validate_json(path.read_text())
    missing = [k for k in range(len(sources)) if k not in found]
    if missing:
        graphs = capture_sources([sources[k] for k in missing], timeout_s=timeout_s)
        keep([sources[k] for k in missing], graphs)
        found.update(zip(missing, graphs, strict=True))
    return [found[k] for k in range(len(sources))]
