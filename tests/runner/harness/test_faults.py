"""A candidate's fault is a verdict: whatever it does to its own process (exit, kill itself, exhaust its file
descriptors, raise what is not an Exception), the verdict is `crash` with a reason, the next candidate is judged as
if nothing happened, and MachineError is raised only when a known-good probe in a fresh process fails too."""

import pytest

from runner.contract import Candidate
from runner.errors import MachineError

from ..adversarial import CRASHES, HONEST_FAST


def cand(cid: str, sources: dict[str, str]) -> Candidate:
    fmt = "kernelbench" if "candidate.py" in sources else "fast"
    return Candidate(id=cid, format=fmt, backend="cpu", sources=sources)


def test_every_fault_of_a_candidate_is_a_crash_verdict_and_the_batch_goes_on(cpu_evaluator):
    names = sorted(CRASHES)
    batch = [cand(n, CRASHES[n][0]) for n in names] + [cand("honest-after", HONEST_FAST)]
    verdicts = cpu_evaluator.evaluate_many(batch)
    for name, v in zip(names, verdicts, strict=False):
        assert not v.accepted, name
        assert any(r.startswith(CRASHES[name][1]) for r in v.reasons), (name, v.reasons)
    assert verdicts[-1].accepted, verdicts[-1].reasons


def test_the_probe_tells_a_broken_machine_from_a_broken_candidate(cpu_evaluator):
    cpu_evaluator.contestants.probe("a failure")  # this machine works: no exception
    device = cpu_evaluator.contestants.device
    cpu_evaluator.contestants.device = "cuda"  # no GPU here: the known-good computation fails as on a dead GPU
    try:
        with pytest.raises(MachineError, match="known-good probe"):
            cpu_evaluator.contestants.fault("trial 0", {"error": "RuntimeError: CUDA error"})
    finally:
        cpu_evaluator.contestants.device = device


def test_a_judge_killed_by_a_candidate_is_that_candidate_s_crash(cpu_evaluator):
    """A judge lost between candidates (a candidate that reached it, where the sandbox lets it) is restarted: the
    next candidate is judged as usual."""
    killer = cand("kills-judge", {"candidate.py": CRASHES["kills_itself"][0]["candidate.py"].replace(
        "        import os, signal\n        os.kill(os.getpid(), signal.SIGKILL)\n",
        "        return scale_relu(x, self.bias)\n")})
    cpu_evaluator.reference.start()
    judge = cpu_evaluator.reference._child  # noqa: SLF001 - the test plays the candidate that reached the judge
    v = cpu_evaluator.evaluate(killer.model_copy(update={"id": "before-kill"}))
    assert v.accepted, v.reasons
    judge.kill()
    after = cpu_evaluator.evaluate(cand("honest-after-kill", HONEST_FAST))
    assert after.accepted, after.reasons  # the judge restarted; the honest candidate pays nothing for it


def test_a_candidates_message_cannot_rewrite_the_terminal_or_the_verdict(cpu_evaluator):
    """Its exception text erased the "rejected" line and printed "correct, 12.00x": now every control character
    but newline and tab is gone from the verdict, its JSON and what the terminal shows."""
    import io

    from rich.console import Console

    from runner.cli.eval import render

    v = cpu_evaluator.evaluate(cand("terminal", CRASHES["forged_terminal_line"][0]))
    assert not v.accepted and v.reasons[0].startswith("runtime: RuntimeError"), v.reasons
    shown = io.StringIO()
    render(v, Console(file=shown, force_terminal=False, width=400))
    for text in (" ".join(v.reasons), v.model_dump_json(), shown.getvalue()):
        assert not any(c in text for c in "\x1b\r\x9b") and "\\u001b" not in text, text
    assert shown.getvalue().splitlines()[0].startswith("rejected at verify: runtime")
