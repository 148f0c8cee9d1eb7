"""Builds ahead of the evaluation: a candidate is compiled as soon as its proposer answers, while the harness is still
verifying and timing the chunk before, so that its own chunk finds it in the build cache.

    ahead = Prebuilds(jobs=os.cpu_count())
    ahead.start(candidates, build)   # build(candidate) -> BuildOutput, on the pool's threads
    ahead.wait(candidates)           # before the chunk's own builds: each one started ahead is finished (cached)

Only on CUDA (runner/harness/evaluator.py): there the compilers use the host's cores while the GPU times; on the CPU
backend a compiler beside the timing would disturb it. A build is keyed by what decides its output (sources, flags,
backend); a failed build is not cached, so the chunk's own build compiles it again and reports its errors.
"""

from __future__ import annotations

import hashlib
import json
import logging
import threading
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor

from runner.contract import Candidate

log = logging.getLogger(__name__)


def build_key(c: Candidate) -> str:
    return hashlib.sha256(json.dumps([c.backend, c.sources, c.extra_cflags], sort_keys=True).encode()).hexdigest()


class Prebuilds:
    def __init__(self, jobs: int) -> None:
        self._pool = ThreadPoolExecutor(max(1, jobs), thread_name_prefix="prebuild")
        self._inflight: dict[str, Future] = {}
        self._lock = threading.Lock()

    def start(self, candidates: Sequence[Candidate], build: Callable[[Candidate], object]) -> None:
        with self._lock:
            for c in candidates:
                key = build_key(c)
                if c.format == "fast" and key not in self._inflight:
                    self._inflight[key] = self._pool.submit(build, c)

    def wait(self, candidates: Sequence[Candidate]) -> None:
        """Let every build started ahead for these candidates finish (its failures are the chunk's own build's to
        report)."""
        with self._lock:
            futures = [f for c in candidates if (f := self._inflight.pop(build_key(c), None)) is not None]
        for f in futures:
            try:
                f.result()
            except Exception as e:  # noqa: BLE001 - the chunk's own build raises it again, where it is handled
                log.info("a build ahead of the evaluation failed: %s", e)

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
