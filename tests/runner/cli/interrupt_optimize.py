"""`fusebot optimize` as a user runs it, for the Ctrl-C test: the real command line, with the harness replaced by a
fake whose evaluation never ends (so the SIGINT lands mid-search) and a scripted proposer.

    python -m tests.runner.cli.interrupt_optimize OUT_DIR READY_FILE

READY_FILE is written when the first chunk is in evaluation.
"""

from __future__ import annotations

import contextlib
import faulthandler
import signal
import sys
import threading
from pathlib import Path

from runner import pipeline
from runner.cli import optimize
from runner.harness import gpus
from tests.fakes.evaluators import PipelineTable
from tests.runner.search.test_loop import Scripted


class Endless(PipelineTable):
    def __init__(self, ready: Path):
        super().__init__()
        self.ready, self.aborted = ready, threading.Event()

    def evaluate_many(self, candidates):
        self.ready.write_text("evaluating\n")
        self.aborted.wait()
        return []

    def abort(self) -> None:
        self.aborted.set()


def main() -> None:
    out, ready = sys.argv[1], Path(sys.argv[2])
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the test asks for every thread's stack if it hangs
    # Ctrl-C as in a terminal: a test run started in the background by a non-interactive shell (as `make test &` is)
    # hands its processes SIGINT ignored, and Python then installs no KeyboardInterrupt for it
    signal.signal(signal.SIGINT, signal.default_int_handler)

    @contextlib.contextmanager
    def fake_evaluators(*args, **kwargs):
        yield Endless(ready)

    gpus.device_evaluators = fake_evaluators  # where the command finds them when it runs
    pipeline.make_proposers = lambda models, builtin=True: [Scripted("a", lambda r, k, j: "ms=1")]
    optimize.optimize_app(["examples/row_gain.py", "--out", out, "--backend", "cpu", "--wall-seconds", "3600"],
                          prog_name="fusebot optimize")


if __name__ == "__main__":
    main()
