"""`fusebot optimize`'s progress and output, in process (typer's CliRunner) with the harness replaced by a table
evaluator and the proposers by a scripted one: the progress counts what the search built, verified and rejected, up
to and including the confirmation's line; off a terminal it is one log line per change; the outcome is on stdout and
nothing else is."""

from __future__ import annotations

import io
import logging
import re
from pathlib import Path

import pytest
from rich.console import Console
from typer.testing import CliRunner

from runner.cli.optimize import optimize_app
from runner.cli.progress import ProgressView, progress_line
from runner.contract import Confirmation, Environment, Progress
from runner.pipeline import baselines_note
from tests.fakes.evaluators import TableEvaluator
from tests.runner.search.test_loop import Scripted

EXAMPLES = Path(__file__).resolve().parents[3] / "examples"

LOG_LINE = re.compile(r"^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d{3} (INFO|WARNING|ERROR) [\w.]+: ")
PROGRESS = re.compile(r"round (\d+)/(\d+): built (\d+), verified (\d+), rejected (\d+), best (\S+)")


class Harness(TableEvaluator):
    """What `fusebot optimize` asks of its evaluator (runner/harness/gpus.py device_evaluators), without a process:
    eager takes 1 ms, no torch.compile, and a candidate's verdict is read off its source (tests/fakes/evaluators.py)."""

    def __init__(self, spec, backend="cpu", **kwargs):
        super().__init__(eager_ms=1.0, compile_ms=None)
        self.spec = spec

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return None

    def reference_source(self):
        return "class Model: ..."

    def roofline(self):
        return None

    def environment(self):
        return Environment(device="cpu", torch="x", python="x", fusebot="x")

    def confirm(self, candidate, rounds=5):
        v = self.evaluate(candidate)
        ms = v.timing.median_ms
        return v.model_copy(update={"confirmation": Confirmation(rounds=rounds, candidate_ms=[ms] * rounds,
                                                                 eager_ms=[1.0] * rounds,
                                                                 speedup_vs_eager=[1.0 / ms] * rounds)})


@pytest.fixture
def run_optimize(monkeypatch, tmp_path):
    """`fusebot optimize examples/row_gain.py` with 3 implementations of one idea: fast, wrong and not building."""
    markers = ["ms=0.25", "wrong", "build-error"]
    # (the command imports both when it runs: replaced where it finds them)
    monkeypatch.setattr("runner.harness.gpus.device_evaluators", lambda spec, backend, devices, config=None, **kw: Harness(spec))
    monkeypatch.setattr("runner.pipeline.make_proposers",
                        lambda models, builtin=True: [(Scripted("scripted", lambda r, k, j: markers[j]), 1.0)])
    root = logging.getLogger()
    saved = root.handlers[:], root.level

    def run(*extra: str):
        args = [str(EXAMPLES / "row_gain.py"), "--out", str(tmp_path / "out"), "--backend", "cpu", "--rounds", "1",
                "--ideas", "1", "--implementations", "3", "--max-repairs", "0", *extra]
        return CliRunner().invoke(optimize_app, args, prog_name="fusebot optimize")

    yield run
    root.handlers[:], _ = saved
    root.setLevel(saved[1])


def test_the_progress_counts_what_the_search_did_through_the_confirmation(run_optimize):
    result = run_optimize()
    assert result.exit_code == 0, result.output
    counts = [tuple(map(int, m.groups()[2:5])) for m in map(PROGRESS.search, result.stderr.splitlines()) if m]
    assert counts, result.stderr
    assert counts[-1] == (2, 1, 2)  # built: the fast and the wrong one; verified: the fast one; rejected: two
    confirming = [ln for ln in result.stderr.splitlines() if "confirming" in ln]
    assert confirming and "built 2, verified 1, rejected 2, best 4.00x" in confirming[-1]
    assert counts == sorted(counts)  # never back to zero


def test_off_a_terminal_progress_is_log_lines_and_the_outcome_alone_is_on_stdout(run_optimize):
    result = run_optimize()
    assert result.exit_code == 0, result.output
    err = result.stderr.splitlines()
    assert err and all(LOG_LINE.match(ln) for ln in err), result.stderr  # no live-line residue, nothing run together
    assert len(err) == len(set(err))  # a line per change, not per call
    out = result.stdout.splitlines()
    assert out[0].startswith(("improved: ", "no improvement: ")) and out[1].startswith("results in "), out
    assert len(out) == 2 and not PROGRESS.search(result.stdout)


def test_on_a_terminal_progress_is_one_live_line():
    buf = io.StringIO()
    view = ProgressView(Console(file=buf, force_terminal=True, width=100), rounds=3)
    assert view.live is not None
    with view:
        view(Progress(round=2, built=5, verified=3, rejected=2, best_speedup=1.5))
    live = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", buf.getvalue())
    assert "verified 3" in live and "best 1.50x unconfirmed" in live and "\x1b[" in buf.getvalue()
    first = io.StringIO()  # before the search: the message alone, whole on an 80-column terminal
    with ProgressView(Console(file=first, force_terminal=True, width=80), rounds=3) as view:
        view(Progress(message=baselines_note()))
    shown = re.sub(r"\x1b\[[0-9;?]*[a-zA-Z]", "", first.getvalue())
    assert "fusebot timing eager and torch.compile (once per problem and machine)\n" in shown
    assert "round 0" not in shown  # no counts before there is anything to count
    plain = ProgressView(Console(file=io.StringIO()), rounds=3)
    assert plain.live is None
    assert progress_line(Progress(round=2, built=5, verified=3, rejected=2, best_speedup=1.5, message="x"), 3) == \
        "round 2/3: built 5, verified 3, rejected 2, best 1.50x unconfirmed (x)"
    assert progress_line(Progress(message="timing eager ..."), 3) == "timing eager ..."
    assert progress_line(Progress(), 3) == "round 0/3: built 0, verified 0, rejected 0, best -"
