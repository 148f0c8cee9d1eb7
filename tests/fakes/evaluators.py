"""Fake evaluators: real implementations of the harness interface the search uses (`evaluate_many`, `baselines`),
for tests that run before, or without, the real harness.

`TableEvaluator` reads the verdict off markers in the candidate's source:
    // FAKE: ms=0.50         accepted, median 0.50 ms
    // FAKE: build-error     rejected at build, with a compiler message
    // FAKE: wrong           rejected at verify, with a mismatch
A source with no marker is rejected at build. It logs every candidate it evaluates (in memory and, if given, to a
file: one id per line, so a test can see what a killed subprocess evaluated).
"""

from __future__ import annotations

import re
from pathlib import Path

from runner.contract import Baselines, BuildInfo, Candidate, Timing, Verdict


def timing(ms: float, n: int = 10) -> Timing:
    return Timing(median_ms=ms, iqr_ms=ms * 0.02, mean_ms=ms, min_ms=ms * 0.98, n=n, samples_ms=[ms] * n,
                  clock="monotonic", l2_flushed=False)


class TableEvaluator:
    def __init__(self, eager_ms: float = 1.0, compile_ms: float | None = 0.8, log_path: Path | None = None,
                 delay_s: float = 0.0):
        self._baselines = Baselines(eager=timing(eager_ms), compile=timing(compile_ms) if compile_ms else None)
        self.log_path = log_path
        self.delay_s = delay_s
        self.evaluated: list[Candidate] = []
        self.batches: list[int] = []

    def baselines(self) -> Baselines:
        return self._baselines

    def evaluate(self, candidate: Candidate) -> Verdict:
        import time

        time.sleep(self.delay_s)
        self.evaluated.append(candidate)
        if self.log_path is not None:
            with self.log_path.open("a") as f:
                f.write(candidate.id + "\n")
        src = "\n".join(candidate.sources.values())
        m = re.search(r"FAKE: (ms=([0-9.]+)|build-error|wrong)", src)
        common = dict(candidate_id=candidate.id, problem="fake", baselines=self._baselines, harness_seconds=0.25)
        if m is None or m.group(1) == "build-error":
            log = "kernel.cpp:3:5: error: 'flaot' was not declared in this scope"
            return Verdict(accepted=False, stage="build", reasons=[f"build: {log}"],
                           build=BuildInfo(ok=False, seconds=0.1, log=log), **common)
        if m.group(1) == "wrong":
            return Verdict(accepted=False, stage="verify", reasons=["mismatch: trial 0: max_abs_err 1.0 at [3, 7]"],
                           build=BuildInfo(ok=True, seconds=0.1), **common)
        ms = float(m.group(2))
        eager, comp = self._baselines.eager, self._baselines.compile
        return Verdict(accepted=True, stage="done", build=BuildInfo(ok=True, seconds=0.1), timing=timing(ms),
                       speedup_vs_eager=eager.median_ms / ms, speedup_vs_compile=comp.median_ms / ms if comp else None,
                       **common)

    def evaluate_many(self, candidates: list[Candidate]) -> list[Verdict]:
        self.batches.append(len(candidates))
        return [self.evaluate(c) for c in candidates]


class PipelineTable(TableEvaluator):
    """A TableEvaluator that also answers what the pipeline asks of the harness before a search: the reference's
    source, no roofline, and an environment."""

    def reference_source(self) -> str:
        return "class Model: ..."

    def roofline(self):
        return None

    def environment(self, confinement=None):
        from runner.contract import Environment

        return Environment(device="cpu", torch="x", python="x", fusebot="x")
