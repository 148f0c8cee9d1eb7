"""The search trace: one JSON object per line, appended and flushed as the search runs.

Events (`event` field; every line also carries `t_s`, seconds of search so far):
  start      the problem context, budget and proposers of a search (a resumed search writes `resume`, and
             builds its prompts from the recorded context, so re-measured baselines do not change them)
  answer     a proposer's raw answer with its cache key and tokens: replayed on resume without new tokens
  ideas      the ideas one proposer gave in one round
  failed     an answer that yielded no candidate
  evaluated  a candidate, its proposer, cache key and the harness's verdict: read back on resume instead of
             re-evaluating, and archived as they were when the resumed run does not reach them (its budget ran out)
  round      the end of a round: best candidate and time so far, whether the round improved
  end        why the search stopped, with its totals

A line cut short by a kill is skipped on reading. Secrets never reach this file: events are built from plain data
that holds none (the LLM settings keep the key in a SecretStr that is never serialised here).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from runner.contract import Candidate, Verdict
from runner.search.types import Answer, Attempt

log = logging.getLogger(__name__)


def candidate_key(candidate: Candidate) -> str:
    """What makes two candidates the same work for the harness: format, backend, sources and flags (not the id)."""
    blob = json.dumps(
        [candidate.format, candidate.backend, sorted(candidate.sources.items()), candidate.extra_cflags],
        ensure_ascii=False,
    )
    return hashlib.sha256(blob.encode()).hexdigest()


def read_events(path: Path) -> Iterator[dict[str, Any]]:
    if not path.exists():
        return
    with path.open(encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.strip()
            if not line:
                continue
            try:
                yield json.loads(line)
            except json.JSONDecodeError:
                log.warning("%s:%d: skipping a truncated trace line", path, n)


@dataclass
class Replay:
    """What a previous run of the same search already finished."""

    answers: dict[str, Answer] = field(default_factory=dict)
    verdicts: dict[str, Verdict] = field(default_factory=dict)  # candidate_key -> verdict
    attempts: dict[str, Attempt] = field(default_factory=dict)  # candidate_key -> the attempt it was evaluated as
    elapsed_s: float = 0.0
    context: dict[str, Any] | None = None  # the problem context the first run's prompts were built from

    @classmethod
    def load(cls, path: Path) -> Replay:
        replay = cls()
        for ev in read_events(path):
            replay.elapsed_s = max(replay.elapsed_s, float(ev.get("t_s", 0.0)))
            if ev.get("event") == "start" and replay.context is None:
                replay.context = ev.get("context")
            elif ev.get("event") == "answer":
                a = Answer(ev["key"], ev["text"], ev.get("prompt_tokens", 0), ev.get("completion_tokens", 0),
                           ev.get("cost_usd", 0.0), ev.get("model", ""), ev.get("finish_reason", "stop"),
                           ev.get("reasoning_chars", 0), ev.get("seconds", 0.0))
                replay.answers[a.key] = a
            elif ev.get("event") == "evaluated":
                v = replay.verdicts[ev["key"]] = Verdict.model_validate(ev["verdict"])
                c = Candidate.model_validate(ev["candidate"])
                replay.attempts[ev["key"]] = Attempt(round=ev.get("round", 0), proposer=ev.get("proposer", ""),
                                                     idea=c.idea, candidate=c, verdict=v, repair_of=c.parent)
        return replay


class Trace:
    """Appends events to a JSONL file, flushing and fsyncing each so a kill loses at most the line being written.
    Thread-safe; a write after close (an answer arriving after the search stopped) is dropped."""

    def __init__(self, path: Path, *, elapsed_offset_s: float = 0.0):
        self.path = path
        path.parent.mkdir(parents=True, exist_ok=True)
        self._f = path.open("a", encoding="utf-8")
        self._t0 = time.monotonic() - elapsed_offset_s
        self._lock = threading.Lock()

    def elapsed_s(self) -> float:
        return time.monotonic() - self._t0

    def write(self, event: str, **data: Any) -> None:
        with self._lock:
            if self._f.closed:
                log.info("trace closed: %s event dropped", event)
                return
            line = json.dumps({"event": event, "t_s": self.elapsed_s(), **data}, ensure_ascii=False, default=str)
            self._f.write(line + "\n")
            self._f.flush()
            os.fsync(self._f.fileno())

    def close(self) -> None:
        with self._lock:
            self._f.close()

    def __enter__(self) -> Trace:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
