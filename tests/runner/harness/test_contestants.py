"""Candidates' processes: a trial's output files are deleted once the judge has read them (they live in /dev/shm,
i.e. memory), and only files inside the candidate's own directory are ever touched; spares started before their
candidates judge them as fresh processes do."""

from runner.contract import Candidate
from runner.harness.contestants import discard_outputs
from runner.harness.evaluator import Evaluator, HarnessConfig

from ..adversarial import FAST_HACKS, HONEST_FAST
from ..conftest import FAST_TIMER, scale_relu_spec


def cand(cid: str, sources: dict[str, str]) -> Candidate:
    return Candidate(id=cid, format="fast", backend="cpu", sources=sources)


def test_read_outputs_are_deleted_and_nothing_outside_the_candidate_dir(tmp_path):
    work = tmp_path / "cand"
    work.mkdir()
    a, b = work / "out_1_a_0.bin", work / "out_1_b_0.bin"
    outside = tmp_path / "elsewhere.bin"
    for f in (a, b, outside):
        f.write_bytes(b"\0" * 8)
    reply = {"outputs": [{"file": str(a)}, {"tensor": False}],
             "second_run": [{"file": str(b)}, {"file": str(outside)}, {"file": str(work / "../elsewhere.bin")}]}
    discard_outputs(work, reply)
    assert not a.exists() and not b.exists()
    assert outside.exists()
    discard_outputs(work, {"outputs": [{"file": str(a)}]})  # already gone: no error


def test_spares_started_before_their_candidates_judge_them_as_fresh_processes_do(harness_cache):
    """Processes started and warmed up before their candidates are known (`prestart`) take the next fast-format
    candidates: an honest one is accepted, and a crash and a timer escape are still rejected with their reasons, so
    the guards' snapshot and the timer checks hold in a process that warmed up early."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(scale_relu_spec(), backend="cpu", config=cfg) as ev:
        ev.contestants.prestart(3)
        ev.contestants.settle()
        spares = sorted(p.name for p in ev.workdir.glob("spare-*"))
        assert len(spares) == 3 and len(ev.contestants._spares) == 3
        names = ["segfault", "lazy_after_warmup"]
        verdicts = ev.evaluate_many([cand("honest", HONEST_FAST), *(cand(n, FAST_HACKS[n][0]) for n in names)])
        assert not ev.contestants._spares  # every candidate took a spare: no process of its own was started
        assert sorted(p.name for p in ev.workdir.glob("spare-*")) == spares
        assert not list(ev.workdir.glob("cand-*"))
    assert verdicts[0].accepted, verdicts[0].reasons
    for name, v in zip(names, verdicts[1:], strict=True):
        assert not v.accepted and any(r.startswith(FAST_HACKS[name][1]) for r in v.reasons), (name, v.reasons)
