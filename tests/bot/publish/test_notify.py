"""A running search's check run says where each of its targets is (its unit: waiting, running on which runner and
how far, done, on which attempt)."""

from __future__ import annotations

from bot.publish.notify import check_run_view
from bot.store.jobs import JobInfo
from bot.store.units import UnitInfo
from runner.contract import Job, JobResult, Progress, TargetResult, TargetSpec


def _job(state: str, names: list[str]) -> JobInfo:
    spec = Job(id="j1", repo="o/r", sha="a" * 40,
               targets=[TargetSpec(name=n, file=f"m/{n}.py", class_name=n) for n in names])
    return JobInfo(id="j1", repo="o/r", sha="a" * 40, pr_number=1, trigger="label", state=state, attempts=1,
                   installation_id=1, check_run_id=None, notified_state=None, source_path=None,
                   progress=Progress(round=1, built=3, verified=2), result=None, error=None, spec=spec)


def _unit(i: int, target: str, state: str, attempts: int = 1, by: str | None = None,
          progress: Progress | None = None) -> UnitInfo:
    return UnitInfo(id=f"j1/{i}", job_id="j1", index=i, repo="o/r", target=target, state=state, attempts=attempts,
                    leased_by=by, progress=progress, result=None, error=None)


def test_each_target_of_a_running_search_shows_its_unit():
    units = [_unit(0, "Norm", "running", by="gpu-b", progress=Progress(round=2, built=5, verified=3)),
             _unit(1, "Gelu", "queued"), _unit(2, "Pool", "succeeded", attempts=2)]
    out = check_run_view(_job("running", ["Norm", "Gelu", "Pool"]), units)
    assert out.status == "in_progress" and out.title == "Searching: round 1, 3 built, 2 verified"
    assert out.summary.splitlines() == ["- `Norm`: running on gpu-b, round 2, 5 built, 3 verified",
                                        "- `Gelu`: waiting for a GPU runner", "- `Pool`: done (attempt 2)"]


def test_without_units_the_targets_are_listed_as_before():
    out = check_run_view(_job("running", ["Norm"]))
    assert out.summary == "- `Norm` (m/Norm.py)"


LOST = "attempt 2 of 3: the previous worker stopped answering (runner gpu-a)"


def test_a_target_whose_worker_was_lost_says_which_attempt_and_why():
    units = [_unit(0, "Norm", "running", by="gpu-b"), _unit(1, "Gelu", "queued")]
    units[1] = UnitInfo(**{**units[1].__dict__, "retry_note": LOST})
    job = JobInfo(**{**_job("running", ["Norm", "Gelu"]).__dict__, "retry_note": LOST})
    out = check_run_view(job, units)
    assert out.summary.splitlines() == ["Attempt 2 of 3: the previous worker stopped answering (runner gpu-a).", "",
                                        "- `Norm`: running on gpu-b", f"- `Gelu`: waiting for a GPU runner — {LOST}"]


def test_a_finished_job_no_longer_shows_the_retry_note():
    job = JobInfo(**{**_job("failed", ["Norm"]).__dict__, "retry_note": LOST, "error": "out of memory"})
    assert "previous worker" not in check_run_view(job).summary


def test_a_search_that_proposes_nothing_gives_each_target_s_own_reason():
    """Declined for different reasons, declined in different words: no blanket "nothing beat the faster baseline"
    over a kernel that won every round on a host too noisy to prove it."""
    slow = "slower: the fastest verified kernel lost every round (0.02-0.12x against eager over 5 rounds)"
    noisy = "faster but not provable on this host: ... rerun on an idle host; not proposed"
    result = JobResult(job_id="j1", ok=True, targets=[TargetResult(target="Norm", improved=False, message=slow),
                                                      TargetResult(target="Gain", improved=False, message=noisy)])
    job = JobInfo(**{**_job("succeeded", ["Norm", "Gain"]).__dict__, "result": result})
    out = check_run_view(job)
    assert (out.status, out.conclusion, out.title) == ("completed", "neutral", "Nothing proposed")
    assert out.summary.splitlines() == [f"- `Norm`: {slow}", f"- `Gain`: {noisy}"]
