"""A module's captured graph kept on disk, beside the baselines (FUSEBOT_CACHE_DIR): a rerun, or a second search of
the same module, does not start the confined capture process again (it imports torch and traces the module: 24 s of
a 30 s budget on 2 CPU cores under a load of 7).

    graph = cached_capture(source)

The key hashes the reference's source, torch's version and the catalog's own code (every module of runner/catalog/
the capture and its graph come from): a change to any of them captures anew. Only a graph that was captured is kept;
a failure (a timeout, a crash, a module torch cannot trace) is captured again next time.
"""

from __future__ import annotations

import functools
import hashlib
from collections.abc import Callable
from pathlib import Path

from runner.catalog.capture import CGraph, capture_source
from runner.harness.build import default_cache_dir
from runner.stored import stored

CATALOG_DIR = Path(__file__).resolve().parents[1] / "catalog"


@functools.cache
def _code_digest() -> str:
    h = hashlib.sha256()
    for path in sorted(CATALOG_DIR.glob("*.py")):
        h.update(path.name.encode() + b"\0" + path.read_bytes())
    return h.hexdigest()


def capture_key(source: str, torch_version: str) -> str:
    parts = "\0".join((hashlib.sha256(source.encode()).hexdigest(), torch_version, _code_digest()))
    return hashlib.sha256(parts.encode()).hexdigest()[:32]


def cached_capture(source: str, *, cache_dir: Path | None = None,
                   capture: Callable[[str], CGraph] = capture_source) -> CGraph:
    """The graph stored for this source, torch and catalog code, else `capture(source)`'s, stored when captured."""
    import torch

    path = (cache_dir or default_cache_dir().parent) / "capture" / f"{capture_key(source, torch.__version__)}.json"
    return stored(path, CGraph, lambda: capture(source), keep=lambda g: g.unsupported is None,
                  what="module's graph")
