"""The baselines measured while the search starts: the first proposers capture the module, generate their kernels and
build them (runner/harness/prebuild.py) while the judge times eager and torch.compile.

    evaluator = BaselinesAhead(evaluator)   # starts evaluator.baselines() on a thread of its own
    search(ctx, evaluator, ...)             # the first evaluation (the judge's next request) waits for them
    baselines = evaluator.baselines()

Only for builtin proposers (the catalog, the source rewrites), which read neither baselines nor roofline; a model's
prompt shows the baselines, so a pool with models measures them first. Everything else is the evaluator's own.
"""

from __future__ import annotations

import threading
from typing import Any

from runner.contract import Baselines, Candidate, Verdict


class BaselinesAhead:
    def __init__(self, evaluator: Any) -> None:
        self._evaluator = evaluator
        self._done = threading.Event()
        self._box: dict[str, Any] = {}
        threading.Thread(target=self._measure, name="baselines", daemon=True).start()

    def _measure(self) -> None:
        try:
            self._box["baselines"] = self._evaluator.baselines()
        except BaseException as e:  # noqa: BLE001 - raised again where the baselines are asked for
            self._box["error"] = e
        finally:
            self._done.set()

    def baselines(self) -> Baselines:
        self._done.wait()
        if "error" in self._box:
            raise self._box["error"]
        return self._box["baselines"]

    def evaluate_many(self, candidates: list[Candidate]) -> list[Verdict]:
        self.baselines()  # the judge serves one request at a time, and a candidate's timing reads the baselines
        return self._evaluator.evaluate_many(candidates)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._evaluator, name)
