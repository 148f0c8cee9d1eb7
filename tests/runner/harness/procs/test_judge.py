"""The judge's classification of a failure in the user's code: their mistake (a ProblemError at their file and line),
unless the device itself failed (left to the parent as a machine fault)."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.errors import ProblemError
from runner.harness.procs import judge


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:  # noqa: BLE001 - a traceback to locate
        return caught


def _state() -> judge.State:
    st = judge.State()
    st.problem = type("Problem", (), {"file": Path(__file__)})()
    return st


def test_an_exception_in_the_users_forward_is_their_problem_at_their_line():
    err = judge.reference_failure(_state(), _raised(RuntimeError("mat1 and mat2 shapes cannot be multiplied")))
    assert isinstance(err, ProblemError) and err.stage == "reference"
    assert err.where.startswith(f"{Path(__file__)}:") and err.cause.startswith("RuntimeError: mat1")


@pytest.mark.parametrize("message", ["CUDA error: no CUDA GPUs are available",
                                     "CUDA driver error: unknown error",
                                     "CUDA error: uncorrectable ECC error encountered"])
def test_a_lost_device_is_left_as_it_is_for_the_parent_to_call_a_machine_fault(message):
    exc = _raised(RuntimeError(message))
    assert judge.reference_failure(_state(), exc) is exc


def test_a_problem_error_in_any_request_is_answered_as_one():
    def baselines(st, msg):
        raise ProblemError("inputs", "models/x.py:10", "ValueError: dataset not found")

    reply = judge._releasing(baselines)(_state(), {})
    assert reply == {"ok": False, "problem_error": {"stage": "inputs", "where": "models/x.py:10",
                                                    "cause": "ValueError: dataset not found"}}


def test_the_judges_steps_make_their_inputs_once_per_cross_check(monkeypatch):
    """The parent times the judge's steps and subtracts them from the candidate's batch: inputs made inside a timed
    request (seconds for a GB-sized problem) would count as steps, and a candidate's batch would be charged less.
    The first request of a cross-check makes them; the next ones only step; its batch_check lets them go."""
    import torch

    made = []

    def inputs(problem, seed, **kw):
        made.append(seed)
        return [torch.ones(4, 8)]

    monkeypatch.setattr(judge, "make_inputs", inputs)
    st = _state()
    specs = [{"shape": [4, 8], "dtype": "torch.float32"}]
    for calls in (1, 1, 4, 16):
        rep = judge.steps(st, {"seed": 7, "out_specs": specs, "calls": calls, "weights_seed": 3})
        assert len(rep["fingerprints"]) == calls and len(rep["fingerprints"][0][0]) == 3
    assert made == [7]
    judge.steps(st, {"seed": 8, "out_specs": specs, "calls": 1, "weights_seed": 3})
    assert made == [7, 8]
    monkeypatch.setattr(judge.batch, "check", lambda *a: [])
    judge.batch_check(st, {"seed": 8, "checks": []})
    assert st.steps == ()


def test_the_judges_timed_steps_keep_their_blocks_as_the_candidates_batches_do(monkeypatch):
    """After every request the judge gives its cached device blocks back, but not after `steps`: the parent subtracts
    those requests' time from the candidate's batches, whose process keeps its blocks; allocating them again inside
    each timed request would be a cost of the judge's alone, taken off the candidate's time (on CUDA it let a
    candidate reporting a ninth of its time pass under the escape line)."""
    import torch

    released = []
    monkeypatch.setattr(judge, "make_inputs", lambda problem, seed, **kw: [torch.ones(4, 8)])
    monkeypatch.setattr(judge.batch, "check", lambda *a: [])
    monkeypatch.setattr(judge.torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setattr(judge.torch.cuda, "empty_cache", lambda: released.append(1))
    st = _state()
    specs = [{"shape": [4, 8], "dtype": "torch.float32"}]
    for calls in (1, 4):
        rep = judge.HANDLERS["steps"](st, {"seed": 7, "out_specs": specs, "calls": calls, "weights_seed": 3})
        assert len(rep["fingerprints"]) == calls
    assert released == []
    judge.HANDLERS["batch_check"](st, {"seed": 7, "checks": []})
    assert released == [1]


def test_torch_compiles_precompiled_headers_go_to_the_judges_compile_cache(monkeypatch, tmp_path):
    """Inductor's precompiled C++ header is built where the judge's torch.compile cache is (the folder keyed by its
    problem), not under TMPDIR, the judge's own directory that every judge starts empty: the next judge of the same
    files finds it there. (Inductor reads these two names when it builds the header.)"""
    import torch._inductor.codecache as codecache

    monkeypatch.setattr(codecache, "_HEADER_DIR", codecache._HEADER_DIR)
    monkeypatch.setattr(codecache, "_HEADER_LOCK_DIR", codecache._HEADER_LOCK_DIR)
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor" / "key"))
    judge._headers_in_compile_cache()
    headers = tmp_path / "inductor" / "key" / "precompiled_headers"
    got = (codecache._HEADER_DIR, codecache._HEADER_LOCK_DIR)
    assert got == (str(headers), str(headers / "locks"))
    assert "_HEADER_DIR" in codecache._precompile_header.__wrapped__.__code__.co_names
