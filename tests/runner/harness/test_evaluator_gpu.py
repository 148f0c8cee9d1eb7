"""The harness on CUDA (run on the H100; skipped without a GPU): honest candidates in both formats accepted, every
hack rejected with its reason, a CUDA error contained to its candidate."""

import pytest

from runner.contract import Candidate, ProblemSpec
from runner.harness.evaluator import Evaluator, HarnessConfig

from ..adversarial import CRASHES, forged_time, kb
from ..adversarial_cuda import (
    BF16_INSIDE_FP32_CU,
    DOWNGRADED_BF16_CU,
    FAST_CU_HACKS,
    HONEST_BF16_CU,
    HONEST_FAST_CU,
    HONEST_FP16_CU,
    HONEST_KB_CUDA,
    KB_CUDA_HACKS,
    OOB_KB_CUDA,
    body_and_header,
    kb_cuda,
)
from ..conftest import FAST_TIMER, FIXTURES, PROBLEMS, scale_relu_spec

pytestmark = pytest.mark.gpu


def cand(cid: str, sources: dict[str, str]) -> Candidate:
    fmt = "kernelbench" if "candidate.py" in sources else "fast"
    return Candidate(id=cid, format=fmt, backend="cuda", sources=sources)


@pytest.fixture(scope="module")
def gpu_evaluator(tmp_path_factory):
    cfg = HarnessConfig(compile_baseline=True, timer=FAST_TIMER, cache_dir=tmp_path_factory.mktemp("cache"))
    with Evaluator(scale_relu_spec(), backend="cuda", config=cfg) as ev:
        yield ev


def test_honest_fast_cuda_candidate_is_accepted(gpu_evaluator):
    v = gpu_evaluator.evaluate(cand("honest-cu", HONEST_FAST_CU))
    assert v.accepted, v.reasons
    assert v.timing.clock == "cuda_events" and v.timing.l2_flushed and v.timing.call == "drop-in"
    assert v.baselines.eager and v.baselines.compile, v.baselines.compile_error
    assert v.environment.gpu and v.environment.cuda and v.environment.driver
    assert v.build.ok and v.build.seconds > 0


def test_honest_kernelbench_cuda_candidate_is_accepted(gpu_evaluator):
    v = gpu_evaluator.evaluate(cand("honest-kb-cu", HONEST_KB_CUDA))
    assert v.accepted, v.reasons


@pytest.mark.parametrize("name", sorted(KB_CUDA_HACKS))
def test_kernelbench_cuda_hack_is_rejected(gpu_evaluator, name):
    sources, reason = KB_CUDA_HACKS[name]
    v = gpu_evaluator.evaluate(cand(name, sources))
    assert not v.accepted
    # On the GPU, verification makes more calls than on the CPU (the profiled first call, the second shape): a kernel
    # that turns lazy after a count of calls is caught while verifying, by what it then returns.
    expected = reason if isinstance(reason, tuple) else (reason,)
    caught = (*expected, *(("uninitialized-output", "shape", "mismatch", "stale-result") if name in LAZY_AFTER_CALLS else ()))
    assert any(r.startswith(caught) for r in v.reasons), v.reasons


LAZY_AFTER_CALLS = {"lazy_after_warmup", "replays_first_timed_output"}


@pytest.mark.parametrize("name", sorted(FAST_CU_HACKS))
def test_fast_cuda_hack_is_rejected(gpu_evaluator, name):
    sources, reason = FAST_CU_HACKS[name]
    v = gpu_evaluator.evaluate(cand(name, sources))
    assert not v.accepted
    assert any(r.startswith(reason) for r in v.reasons), v.reasons


def test_cuda_error_does_not_change_the_next_verdict(gpu_evaluator):
    bad = gpu_evaluator.evaluate(cand("oob", FAST_CU_HACKS["illegal_address"][0]))
    assert not bad.accepted and any(r.startswith("crash") for r in bad.reasons), bad.reasons
    good = gpu_evaluator.evaluate(cand("after-oob", HONEST_FAST_CU))
    assert good.accepted, good.reasons


def test_an_out_of_bounds_write_is_a_crash_verdict_and_the_batch_goes_on(gpu_evaluator):
    """The sticky CUDA error of an unsynchronised out-of-bounds write surfaces in the harness's own code (the sync,
    torch.cuda.empty_cache()): a `crash` verdict, never MachineError, and the candidates after it are judged."""
    oob, after = gpu_evaluator.evaluate_many([cand("oob-kb", OOB_KB_CUDA), cand("after-oob-kb", HONEST_FAST_CU)])
    assert not oob.accepted and any(r.startswith("crash") for r in oob.reasons), oob.reasons
    assert after.accepted, after.reasons


def test_every_cpu_crash_has_a_cuda_twin_that_is_a_verdict(gpu_evaluator):
    kb_names = [n for n, (src, _) in CRASHES.items() if "candidate.py" in src]
    sources = {n: kb_cuda(*body_and_header(CRASHES[n][0])) for n in kb_names}
    verdicts = gpu_evaluator.evaluate_many([cand(n, sources[n]) for n in kb_names])
    for n, v in zip(kb_names, verdicts, strict=True):
        # CUDA's runtime reports a process out of descriptors as an error of the call: a runtime verdict, still the
        # candidate's (never a broken machine)
        caught = (CRASHES[n][1], "runtime") if n == "exhausts_fds" else (CRASHES[n][1],)
        assert not v.accepted and any(r.startswith(caught) for r in v.reasons), (n, v.reasons)


@pytest.mark.parametrize("dtype, sources, accepted", [("bfloat16", HONEST_BF16_CU, True),
                                                      ("float16", HONEST_FP16_CU, True),
                                                      ("bfloat16", DOWNGRADED_BF16_CU, False)])
def test_half_precision_kernels_are_judged_against_the_float64_oracle(tmp_path, dtype, sources, accepted):
    spec = ProblemSpec(name="swiglu", path=str(PROBLEMS / "swiglu_bf16.py"),
                       dtype=None if dtype == "bfloat16" else dtype)  # bf16 read from the outputs
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=tmp_path)
    with Evaluator(spec, backend="cuda", config=cfg) as ev:
        v = ev.evaluate(cand(f"swiglu-{dtype}-{accepted}", sources))
    assert v.accepted == accepted, v.reasons
    assert not any("no float64 oracle" in w for w in v.warnings), v.warnings
    if not accepted:
        assert v.reasons[0].startswith("mismatch") and "float64 oracle" in v.reasons[0], v.reasons


def test_bf16_inside_an_fp32_problem_is_a_precision_downgrade(gpu_evaluator):
    v = gpu_evaluator.evaluate(cand("bf16-inside-cu", BF16_INSIDE_FP32_CU))
    assert not v.accepted and any("precision downgrade" in r for r in v.reasons), v.reasons


@pytest.mark.slow
def test_load_inline_cuda_candidate_is_accepted(tmp_path):
    src = (FIXTURES / "candidates" / "scale_relu_load_inline_cuda.py").read_text()
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=tmp_path)
    with Evaluator(scale_relu_spec(), backend="cuda", config=cfg) as ev:
        v = ev.evaluate(cand("load-inline-cu", {"candidate.py": src}))
    assert v.accepted, v.reasons


def test_cuda_outputs_reach_the_judge_by_the_path_the_sandbox_allows(gpu_evaluator, caplog):
    """Under bubblewrap each child has its own PID namespace, which CUDA IPC cannot cross: outputs go through files,
    and the trial log says why; unconfined, they go by CUDA IPC. Either way the verdict is the honest one."""
    with caplog.at_level("DEBUG", logger="runner.harness.trials"):  # a trial's line is a debug record
        v = gpu_evaluator.evaluate(cand("honest-cu-ipc", HONEST_FAST_CU))
    assert v.accepted, v.reasons
    trials = [r.getMessage() for r in caplog.records if " trial " in r.getMessage()]
    confined = (v.environment.sandbox or {}).get("bwrap")
    hand_off = "outputs by files (each process has its own PID namespace" if confined else "outputs by cuda-ipc"
    assert trials and all(hand_off in m for m in trials), trials


@pytest.mark.parametrize("scale", [0.11, 0.6])
def test_a_cuda_process_that_scales_its_reported_times_is_held_to_the_parents_clock(tmp_path, scale):
    """CUDA events read in the candidate's own process, scaled through its dispatch dict: on a kernel of about half a
    millisecond, whatever the verdict, the scaled time never counts. Refused, the reason is the parent's: a time
    under half the parent's back-to-back time is an escape, and a time raised to the parent's bound that lands under
    the memory floor and does not hold in a fresh process is refused as below the floor (both seen on an H200, the
    second for the 0.6 scaler: bound 0.5028 ms against a floor of 0.5029 ms, 0.7086 ms in the fresh process)."""
    problem = tmp_path / "scale_relu_large.py"
    problem.write_text((PROBLEMS / "scale_relu.py").read_text().replace("batch, features = 64, 256",
                                                                       "batch, features = 16384, 16384"))
    spec = ProblemSpec(name="scale_relu_large", path=str(problem), second_inputs="get_second_inputs")
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER)
    forged = kb_cuda(*body_and_header(kb("        return scale_relu(x, self.bias)\n", header=forged_time(scale))))
    with Evaluator(spec, backend="cuda", config=cfg) as ev:
        v = ev.evaluate(Candidate(id=f"forged-{scale}", format="kernelbench", backend="cuda", sources=forged))
    if not v.accepted:
        assert v.reasons[0].startswith(("timer-escape", "below-floor")), v.reasons
        return
    # accepted (an honest scale, or an escape line hidden by the judge's noise: seen on an H200 shared with other
    # tests' processes): the time that counts is the parent's bound, never the scaled one, and is near the memory
    # floor (2 GiB moved: about 0.5 ms), where the scaled time claimed 0.11 of it
    assert v.timing.parent_ms is not None and v.timing.median_ms >= v.timing.parent_ms, v.timing
    assert v.roofline is not None and v.timing.median_ms >= 0.8 * v.roofline.floor_ms, (v.timing, v.roofline)
