"""A kernel's figures as its PR states them (runner/results/figures.py): judged by `assessment`, and measured by the
PR's own bench script run for real on the CPU (g++ builds the kernel), its figures replacing the harness's."""

from __future__ import annotations

import os

import pytest

from runner.contract import Baselines, Confirmation, Timing, Verdict
from runner.harness.config import confirm_rounds_setting
from runner.harness.confirm import confirmation
from runner.results.figures import assessment, pooled, processes_for, stated, with_figures
from runner.results.files import slug
from tests.runner.results.test_bench_script import KERNELS, repo_with_kernel
from tests.verdicts import SPEC


def _timing(ms: float) -> Timing:
    return Timing(median_ms=ms, iqr_ms=0.01, mean_ms=ms, min_ms=ms, n=50, samples_ms=[ms] * 50, clock="monotonic",
                  l2_flushed=True)


def _verdict(**kw) -> Verdict:
    base = {"candidate_id": "k", "problem": "p", "accepted": True, "timing": _timing(1.0),
            "baselines": Baselines(eager=_timing(2.0), compile=_timing(1.5))}
    return Verdict(**{**base, **kw})


def test_assessment_names_what_fails():
    assert assessment(_verdict()) == (True, "verified; 1 ms, 1.50x faster than torch.compile (1.5 ms)")
    bad = _verdict(accepted=False, reasons=["mismatch: 3 of 64 elements"], stage="verify", timing=None)
    assert assessment(bad) == (False, "not verified: mismatch: 3 of 64 elements")
    holds, why = assessment(_verdict(timing=_timing(1.6)))
    assert not holds and why == "verified, but not faster: 1.6 ms against 1.5 ms for torch.compile"
    rounds = Confirmation(rounds=2, candidate_ms=[1.0, 1.6], eager_ms=[2.0, 2.0], compile_ms=[1.5, 1.5],
                          speedup_vs_eager=[2.0, 1.25], speedup_vs_compile=[1.5, 0.94])
    holds, why = assessment(_verdict(confirmation=rounds))  # faster pooled, but not in every round
    assert not holds and why.startswith("verified, but not faster than torch.compile in every round")
    assert "0.94-1.50x over 2 alternating rounds" in why


def _rounds(kernel_ms: float, compile_ms: float) -> Confirmation:
    return Confirmation(rounds=3, candidate_ms=[kernel_ms] * 3, eager_ms=[2.0] * 3, compile_ms=[compile_ms] * 3,
                        speedup_vs_eager=[2.0 / kernel_ms] * 3, speedup_vs_compile=[compile_ms / kernel_ms] * 3)


def test_a_remeasured_kernel_holds_only_above_the_minimum_effect():
    under = _verdict(timing=_timing(1.0), baselines=Baselines(eager=_timing(2.0), compile=_timing(1.02)),
                     confirmation=_rounds(1.0, 1.02))  # 2% in every round: under the 3% floor
    holds, why = assessment(under)
    assert not holds and why.startswith("verified, but below the minimum effect: 1.02x over torch.compile, under "
                                        "the 3% margin")
    over = _verdict(timing=_timing(1.0), baselines=Baselines(eager=_timing(2.0), compile=_timing(1.05)),
                    confirmation=_rounds(1.0, 1.05))
    holds, why = assessment(over)
    assert holds and why.endswith("over 3 alternating rounds; margin 3%)")


def test_a_pr_states_its_bench_script_s_figures_and_keeps_the_harness_s_in_a_warning(tmp_path):
    root = repo_with_kernel(tmp_path)
    t = _timing(0.5)
    rounds = [Baselines(eager=_timing(1.0), compile=_timing(0.8))] * 3
    timing, baselines, conf = confirmation([t] * 3, rounds)
    harness = Verdict(candidate_id="fused", problem=SPEC.name, accepted=True, timing=timing, baselines=baselines,
                      confirmation=conf)
    out, holds, why = stated(root, KERNELS, slug(SPEC.name), SPEC.name, harness, None, backend="cpu")
    rounds = confirm_rounds_setting(os.environ)  # as many as a search's confirmation (the suite's: tests/conftest.py)
    assert out.confirmation.rounds == rounds and out.timing.clock == "monotonic"
    assert out.timing.samples_ms != timing.samples_ms and out.timing.n >= 10 * rounds
    assert (holds, why) == assessment(out)  # faster or not, as the script measured it on this machine
    assert any(w.startswith(f"figures from `python {slug(SPEC.name)}/bench_") and
               w.endswith("; the harness measured 1.60-1.60x over the faster baseline in 3 rounds")
               for w in out.warnings), out.warnings
    # neither the script's figures file nor its caches are left in the PR's tree
    assert sorted(p.name for p in root.iterdir()) == ["examples", KERNELS]


def test_a_pr_whose_bench_script_fails_states_the_harness_s_figures_and_is_not_a_claim(tmp_path):
    root = repo_with_kernel(tmp_path)
    (root / KERNELS / slug(SPEC.name) / f"bench_{slug(SPEC.name)}.py").write_text("raise SystemExit(3)\n")
    harness = _verdict()
    out, holds, why = stated(root, KERNELS, slug(SPEC.name), SPEC.name, harness, None, backend="cpu")
    assert out == harness and not holds and why.startswith("its bench script gave no figures (the bench script "
                                                           "failed (exit status 3)")


def test_a_kernel_faster_alone_but_not_in_a_users_call_is_not_a_claim():
    """RowGain on the H200: its kernel 7x torch.compile with flushed caches, a call through the drop-in 0.0304 ms back
    to back against eager's 0.0385 ms and torch.compile's 0.0606 ms: 1.27x over eager holds; at 0.040 ms it would not."""
    def timed(ms: float, b2b: float) -> Timing:
        return _timing(ms).model_copy(update={"back_to_back_ms": b2b})

    conf = Confirmation(rounds=3, candidate_ms=[0.0054] * 3, eager_ms=[0.0385] * 3, compile_ms=[0.0378] * 3,
                        speedup_vs_eager=[7.1] * 3, speedup_vs_compile=[7.0] * 3)
    base = Baselines(eager=timed(0.0385, 0.0385), compile=timed(0.0378, 0.0606))
    holds, why = assessment(_verdict(timing=timed(0.0054, 0.0304), baselines=base, confirmation=conf))
    assert holds and "a user's call back to back 1.27x (0.0304 ms against 0.0385 ms)" in why
    holds, why = assessment(_verdict(timing=timed(0.0054, 0.040), baselines=base, confirmation=conf))
    assert not holds and "its kernel is 7.00x faster than torch.compile with flushed caches, but a user's call is " \
        "not: through the drop-in, back to back, 0.04 ms a call against 0.0385 ms for eager (0.96x, under the 3% " \
        "margin)" in why
    assert assessment(_verdict(timing=timed(0.0054, 0.040), baselines=Baselines(eager=_timing(0.0385)),
                               confirmation=conf))[0]  # a baseline without its back-to-back figure: not judged on it


def test_two_processes_pool_their_rounds_and_samples():
    def run(k: float, c: float) -> dict:
        return {"device": "H100", "backend": "cuda", "rounds": 2, "label": "fusebot", "contestants": {
            "fusebot": {"samples_ms": [k, k], "round_medians_ms": [k, k], "back_to_back_ms": [k + 1, k + 2]},
            "PyTorch eager": {"samples_ms": [2.0, 2.0], "round_medians_ms": [2.0, 2.0]},
            "torch.compile": {"samples_ms": [c, c], "round_medians_ms": [c, c]}}}
    both = pooled([run(1.0, 1.5), run(1.0, 1.2)])
    assert both["rounds"] == 4 and both["processes"] == 2
    assert both["contestants"]["torch.compile"]["round_medians_ms"] == [1.5, 1.5, 1.2, 1.2]
    assert both["contestants"]["fusebot"]["back_to_back_ms"] == [2.0, 3.0, 2.0, 3.0]
    assert both["contestants"]["torch.compile"]["back_to_back_ms"] == []  # not measured: none pooled
    v = with_figures(_verdict(), both, SPEC.name, "f")
    assert v.confirmation.speedup_vs_faster() == pytest.approx([1.5, 1.5, 1.2, 1.2])
    assert v.timing.n == 4 and "4 rounds in 2 processes;" in v.warnings[-1] and v.confirmation.processes == 2
    assert processes_for("cuda") == 2 and processes_for("cpu") == 1
