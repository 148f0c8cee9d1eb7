"""The PR body (and title) as a reviewer reads it: the title names module, speedup and device; the verdict comes first, then one
summary table; the compatibility block states backend, shapes, dtypes, tolerance and what works on that backend; one
line per declined target; the trace folded and clipped; the footer says how to reproduce, roll back and decline.
A PyTorch rewrite is shown as its diff, and its row appears wherever one was verified. From real Verdicts: the numbers
as the harness measured them, the markers, GitHub's limit kept with a huge trace, the confirmation rounds per round."""

from __future__ import annotations

import json
import re

from bot.github.platform import find_marker, marker
from bot.publish.body import DIFF_CHARS, compatibility, pr_body, pr_title, rewrite_diff
from bot.publish.plan import PullRequestPlan
from bot.publish.propose import branch_files, merged
from bot.publish.text import BODY_LIMIT
from bot.publish.verdicts import manifest_of, target_table
from runner.contract import Baselines, Confirmation, Environment, Roofline, TargetResult, TrialResult, Verdict
from runner.results.adoption import adopted
from tests.bot.results import improved_result, plan_of, row_numbers, slow_result
from tests.fakes.evaluators import timing

CPU = Environment(device="cpu", cpu="AMD EPYC 7B13", torch="2.13.0", python="3.11.4", fusebot="0.1")
GPU = Environment(device="cuda", gpu="NVIDIA H100 80GB HBM3", cpu="AMD EPYC 7B13", cuda="12.8", driver="570",
                  torch="2.13.0", python="3.11.4", fusebot="0.1")
VERIFIED = {"backend": "cpu", "atol": 1e-4, "rtol": 1e-4,
            "shapes": [{"inputs": [{"shape": [4096, 1024], "dtype": "float32"}],
                        "outputs": [{"shape": [4096, 1024], "dtype": "float32"}]},
                       {"inputs": [{"shape": [17, 1000], "dtype": "float32"}], "outputs": []}]}


def verdict(env: Environment, ms: float = 0.5, compile_ms: float = 1.0) -> Verdict:
    per = [compile_ms / ms * f for f in (0.99, 1.0, 1.02)]
    conf = Confirmation(rounds=3, candidate_ms=[ms] * 3, eager_ms=[2.0] * 3, compile_ms=[compile_ms * f for f in
                                                                                        (0.99, 1.0, 1.02)],
                        speedup_vs_eager=[2.0 / ms] * 3, speedup_vs_compile=per)
    trials = [TrialResult(index=i, shape_set=i // 4, distribution="factory" if i % 2 else "randn*1+0", passed=True,
                          max_abs_err=2.5e-7, max_rel_err=1.5e-6) for i in range(7)]
    return Verdict(candidate_id="c", problem="row_gain", accepted=True, timing=timing(ms), trials=trials,
                   baselines=Baselines(eager=timing(2.0), compile=timing(compile_ms)), confirmation=conf,
                   roofline=Roofline(bytes_moved=1 << 20, bandwidth_bytes_per_s=1e10, bandwidth_source="measured",
                                     floor_ms=0.3), pct_of_floor=60.0, environment=env)


def kernel_result(env: Environment = CPU, rewrite_ms: float | None = 0.9) -> TargetResult:
    backend = "cuda" if env.gpu else "cpu"
    timings = {"PyTorch rewrite": {"median_ms": rewrite_ms, "iqr_ms": 0.01, "n": 10, "clock": "monotonic",
                                   "samples_ms": [rewrite_ms] * 10}} if rewrite_ms else {}
    man = {"kernel": "kernel.cpp", "change": "kernel", "margin": 0.04, "choice": "the kernel is faster",
           "verified": VERIFIED | {"backend": backend}, "timings": timings}
    files = {"row_gain/kernel.cpp": "//", "row_gain/dropin.py": "", "row_gain/fusebot.json": json.dumps(man),
             "row_gain/bench_row_gain.py": ""}
    trace = "### Round 1\n\n| candidate | idea | verdict | why |\n| --- | --- | --- | --- |\n" + "\n".join(
        f"| c{i} | fuse | verified, 0.5 ms | 2.00x over torch.compile |" for i in range(60))
    return TargetResult(target="row_gain", improved=True, verdict=verdict(env), message="faster", files=files,
                        trace_markdown=trace, file="examples/row_gain.py", class_name="RowGain")


def rewrite_result() -> TargetResult:
    diff = "--- a/examples/row_gain.py\n+++ b/examples/row_gain.py\n@@ -1 +1 @@\n-x = a * b + c\n+x = torch.addcmul(c, a, b)\n"
    man = {"kind": "rewrite", "change": "rewrite", "margin": 0.03, "diff": diff, "verified": VERIFIED,
           "choice": "the PyTorch rewrite (1.96x) is as fast as the best kernel (2.00x) within the 3% margin"}
    files = {"/examples/row_gain.py": "x = torch.addcmul(c, a, b)\n", "row_gain/fusebot.json": json.dumps(man),
             "row_gain/BENCHMARK.md": "", "row_gain/bench_row_gain.py": ""}
    return TargetResult(target="row_gain", improved=True, verdict=verdict(CPU, ms=0.51), message="faster",
                        files=files, file="examples/row_gain.py", class_name="RowGain")


def declined(name: str, why: str) -> TargetResult:
    return TargetResult(target=name.lower(), improved=False, verdict=verdict(CPU, ms=1.01), message=why,
                        class_name=name, trace_markdown="| c | x | rejected at verify | mismatch: bad |")


def plan(*results: TargetResult, env: Environment = CPU) -> PullRequestPlan:
    return PullRequestPlan(repo="acme/m", base="main", group="examples", commit="abcdef1234567890",
                           results=list(results), environment=env, source_pr=7)


def test_the_title_names_module_speedup_and_device():
    assert pr_title(plan(kernel_result())) == \
        "fusebot: RowGain 2.00x faster than torch.compile (fused kernel, CPU AMD EPYC 7B13)"
    assert pr_title(plan(kernel_result(GPU), env=GPU)).endswith("(fused kernel, NVIDIA H100 80GB HBM3)")
    assert pr_title(plan(rewrite_result())).endswith("(PyTorch rewrite, CPU AMD EPYC 7B13)")


def test_what_a_reviewer_needs_comes_first():
    body = pr_body(plan(kernel_result(), declined("ScaledSoftmax", "below the minimum effect: 1.01x"),
                        declined("SwishBias", "nothing beat torch.compile in every round")))
    lines = body.splitlines()
    assert lines[1].startswith("**Proposed**: a fused kernel for `RowGain`, **2.00x** faster than torch.compile on "
                               "CPU AMD EPYC 7B13; 2 of 3 target(s) declined.")
    assert lines[3].startswith("| module | before → after (median) | speedup over the faster baseline | spread | % of "
                               "floor |")
    assert lines[5] == ("| `RowGain` | 1 ms (torch.compile) → 0.5 ms | **2.00x** (margin 4%) | 1.98-2.04x over 3 "
                        "rounds | 60% | fused kernel + drop-in |")
    assert lines[6].startswith("| `RowGain`: PyTorch rewrite | 1 ms (torch.compile) → 0.9 ms | 1.11x |")
    assert "- `ScaledSoftmax`: below the minimum effect: 1.01x" in lines[:12]
    assert "- `SwishBias`: nothing beat torch.compile in every round" in lines[:12]
    compat = body[body.index("#### `RowGain`: compatibility"):]
    assert compat.index("| Runs on | CPU AMD EPYC 7B13 (cpu backend") < 400
    assert "| Verified on | (4096, 1024) float32; (17, 1000) float32: 7 of 7 trials passed over 2 input" in compat
    assert "atol 0.0001, rtol 0.0001 beyond eager's own error" in compat and "float64 oracle" in compat
    assert "largest difference from eager: abs 2.5e-07, rel 1.5e-06" in compat
    assert "| Autograd | ✅ the drop-in defers to your original module whenever gradients are needed" in compat
    assert "| CUDA graphs | ❌ a CPU kernel" in compat and "| TorchScript (jit) | ❌" in compat
    assert "| Other devices, dtypes, sizes | ❌ the kernel runs only on the CPU, float32" in compat
    assert "a C++ compiler (g++)" in compat and "CUDA graphs as" not in body  # no CUDA-graph promise on a CPU
    assert "<details><summary>Search trace: RowGain</summary>" in body and "| c24 |" in body and "| c25 |" not in body
    assert "…35 more candidate(s) left out" in body
    assert "| PyTorch rewrite (not proposed) | 0.9 |" in body  # the details table's row too
    tail = body[body.rindex("---"):]
    assert "**Reproduce** the figures: `python fusebot_kernels/row_gain/bench_row_gain.py`" in tail
    assert "pytest checks correctness only" in tail and "**Roll back**: set `FUSEBOT_DISABLE=1` and every drop-in " \
        "runs your original forward, no code change; or revert this PR's commit." in tail
    assert "**Closing this PR** does not stop fusebot" in tail and "`ignore:`" in tail
    assert body.index("#### `RowGain`: compatibility") < body.index("<details>") < body.index("**Reproduce**")


def test_a_cuda_kernel_states_what_holds_on_a_gpu():
    compat = compatibility(kernel_result(GPU), GPU, "row_gain", "fusebot_kernels")
    assert "| Runs on | NVIDIA H100 80GB HBM3 (cuda backend: `row_gain/kernel.cu`" in compat
    assert "| CUDA graphs | ✅ captured and replayed in a CUDA graph by the drop-in's own test, which the runner ran " \
        "on the GPU before proposing" in compat and "not checked" not in compat
    assert "nvcc (the CUDA toolkit) to build the kernel" in compat and "this GPU model" in compat
    prebuilt = kernel_result(GPU)
    prebuilt = prebuilt.model_copy(update={"files": {**prebuilt.files, "row_gain/kernel.sm_90.so.b64": "f0VMRg=="}})
    shipped = compatibility(prebuilt, GPU, "row_gain", "fusebot_kernels")
    assert "torch only: the library built on the runner ships beside the drop-in" in shipped
    device = prebuilt.model_copy(update={"files": {**kernel_result(GPU).files, "row_gain/kernel.sm_90.cubin.b64": "x",
                                                   "row_gain/kernel.compute_90.ptx": "x"}})
    only = compatibility(device, GPU, "row_gain", "fusebot_kernels")
    assert "torch and the CUDA driver only: device code ships beside the drop-in" in only
    assert "no host code of the kernel runs" in only and "library built on the runner" not in only
    man = json.loads(kernel_result(GPU).files["row_gain/fusebot.json"]) | {
        "no_device_code": "its host code cannot be written down as launch plans (cudaMemcpy)"}
    none = kernel_result(GPU).model_copy(update={"files": {**kernel_result(GPU).files,
                                                           "row_gain/fusebot.json": json.dumps(man)}})
    declined = compatibility(none, GPU, "row_gain", "fusebot_kernels")
    assert "No binary ships: the device code was not made (its host code cannot be written down as launch plans " \
        "(cudaMemcpy)), and fusebot does not ship a host library" in declined
    assert "nvcc (the CUDA toolkit) to build `kernel.cu` on first use (cached); without it the original forward " \
        "runs" in declined


def test_a_rewrites_stated_precondition_is_a_row_of_its_compatibility_block():
    r = rewrite_result()
    man = json.loads(r.files["row_gain/fusebot.json"]) | {"preconditions": ["`x` holds no inf or NaN"]}
    stated = r.model_copy(update={"files": {**r.files, "row_gain/fusebot.json": json.dumps(man)}})
    assert "| Precondition | equal to the original only where `x` holds no inf or NaN |" in pr_body(plan(stated))
    assert "Precondition" not in pr_body(plan(r))


def test_a_rewrite_is_shown_as_its_diff_with_no_dropin_promises():
    r = rewrite_result()
    body = pr_body(plan(r))
    assert "a PyTorch rewrite of `RowGain`" in body.splitlines()[1]
    assert "| PyTorch rewrite of `examples/row_gain.py` |" in body
    assert "```diff\n--- a/examples/row_gain.py\n+++ b/examples/row_gain.py" in body
    assert "+x = torch.addcmul(c, a, b)" in body and "Why this change: the PyTorch rewrite (1.96x)" in body
    assert "FUSEBOT_DISABLE" not in body and "dropin" not in body
    assert "**Roll back**: revert this PR's commit." in body.splitlines()  # one way back, said as one sentence
    assert "- `examples/row_gain.py`" in body  # the files list names the module at its own path
    files = branch_files(plan(r))
    assert files["examples/row_gain.py"] == "x = torch.addcmul(c, a, b)\n"
    assert "fusebot_kernels/row_gain/fusebot.json" in files and not [p for p in files if p.startswith("/")]


MODULE = "class A:\n    pass\n\n\nclass B:\n    pass\n"
WITH_A = MODULE + "\n\n# ---- fusebot: A\nA = adopt_a(A)\n"
WITH_B = MODULE + "\n\n# ---- fusebot: B\nB = adopt_b(B)\n"


def test_changes_of_one_file_by_several_targets_are_put_together():
    assert merged(MODULE, [WITH_A, WITH_B]) == WITH_A + "\n\n# ---- fusebot: B\nB = adopt_b(B)\n"
    assert merged(MODULE, [WITH_B, WITH_A]) == WITH_B + "\n\n# ---- fusebot: A\nA = adopt_a(A)\n"
    assert merged(MODULE, [WITH_A, WITH_A]) == WITH_A  # one change made twice is made once
    rewrite_a = MODULE.replace("class A:\n    pass", "class A:\n    x = 1")
    assert merged(MODULE, [rewrite_a, WITH_B]) == WITH_B.replace("class A:\n    pass", "class A:\n    x = 1")
    assert merged(MODULE, [rewrite_a, MODULE.replace("class A:\n    pass", "class A:\n    y = 2")]) is None


def test_two_adoption_edits_put_together_are_the_edits_made_one_after_the_other():
    a, b = adopted(MODULE, "A", "kernels/a"), adopted(MODULE, "B", "kernels/b")
    assert merged(MODULE, [a, b]) == adopted(a, "B", "kernels/b")
    assert merged(MODULE, [b, a]) == adopted(b, "A", "kernels/a")


def test_a_pr_of_two_targets_of_one_module_adopts_both():
    def adopting(target: str, text: str) -> TargetResult:
        r = kernel_result()
        files = {f"{target}/{k.split('/', 1)[1]}": v for k, v in r.files.items()} | {"/pkg/m.py": text}
        return r.model_copy(update={"target": target, "files": files, "file": "pkg/m.py", "class_name": target})

    two = plan(adopting("A", WITH_A), adopting("B", WITH_B))
    assert branch_files(two, {"pkg/m.py": MODULE}.get)["pkg/m.py"] == merged(MODULE, [WITH_A, WITH_B])
    assert branch_files(two)["pkg/m.py"] == WITH_A  # no base text to put them together on: the first stands
    assert branch_files(plan(adopting("A", WITH_A)), {}.get)["pkg/m.py"] == WITH_A


def test_a_long_diff_is_cut_and_says_where_the_whole_is():
    r = rewrite_result()
    m = manifest_of(r) | {"diff": "".join(f"+line {i}\n" for i in range(5000))}
    r = r.model_copy(update={"files": {**r.files, "row_gain/fusebot.json": json.dumps(m)}})
    shown = rewrite_diff(r)
    assert len(shown) < DIFF_CHARS + 300 and "diff cut at" in shown and "see the PR's files" in shown


def test_without_a_manifest_the_body_still_says_what_the_verdict_knows():
    r = kernel_result()
    r = r.model_copy(update={"files": {k: v for k, v in r.files.items() if not k.endswith(".json")}})
    compat = compatibility(r, CPU, "row_gain", "fusebot_kernels")
    assert "| Verified on | 2 shape set(s): 7 of 7 trials passed" in compat
    assert "the dtype's default tolerance" in compat and manifest_of(r) == {}


# ---- from real Verdicts (the CPU harness run once per session) ------------------------------------------------

def test_the_body_carries_the_verdicts_numbers_markers_and_adoption():
    r = improved_result()
    v = r.verdict
    body = pr_body(plan_of(r, slow_result()))
    assert body.startswith("<!-- fusebot:pr key=main/examples -->")
    assert find_marker(body, "pr") == "main/examples"
    for t in (v.baselines.eager, v.baselines.compile, v.timing):
        assert row_numbers(t) in body
    base = min(v.baselines.eager.median_ms, v.baselines.compile.median_ms)
    assert f"**{base / v.timing.median_ms:.2f}x** faster" in body  # the verdict line
    assert f"{v.speedup_vs_eager:.2f}x" in body and f"{v.speedup_vs_compile:.2f}x" in body
    assert f"{100 * v.roofline.floor_ms / v.timing.median_ms:.2f}%" in body
    passed = sum(t.passed for t in v.trials)
    assert f"{passed}/{len(v.trials)} trials passed" in body
    assert f"{max(t.max_abs_err for t in v.trials):.3g}" in body
    e = v.environment
    assert f"torch {e.torch}" in body and (e.cpu or e.gpu) in body and f"Python {e.python}" in body
    assert "from fusebot_kernels.scaledbiasrelu.dropin import ScaledBiasReLU" in body
    assert "<details><summary>Search trace: ScaledBiasReLU</summary>" in body
    assert "\n- `Slow`: nothing beat eager" in body  # the slow target: one line with why, not proposed
    assert "/fusebot benchmark" in body and "#7" in body

def test_a_huge_trace_is_truncated_never_the_tables():
    huge = "\n".join(f"| r{i} | idea {i} | rejected at verify | mismatch {'x' * 80} |" for i in range(20_000))
    r = improved_result(trace=huge)
    body = pr_body(plan_of(r, slow_result()))
    assert len(body) <= BODY_LIMIT < len(huge)
    assert target_table(r) in body and target_table(slow_result().model_copy(update={"message": ""})) in body
    assert "| r24 | idea 24 |" in body and "| r25 |" not in body  # clipped to its first rows, saying so
    assert "…19975 more candidate(s) left out; `/fusebot explain` posts the whole trace." in body
    long_rows = "\n".join(f"| r{i} | {'y' * 4000} |" for i in range(20))  # few rows, each enormous
    body = pr_body(plan_of(improved_result(trace=long_rows), slow_result()), limit=30_000)
    cut = re.search(r"trace truncated \((\d+) characters left out\)", body)
    assert len(body) <= 30_000 and cut and int(cut.group(1)) > 0
    assert marker("pr", "main/examples") in body

def test_the_confirmation_rounds_are_shown_per_round():
    from runner.contract import Confirmation

    r = improved_result()
    v = r.verdict
    e, c, k = v.baselines.eager.median_ms, v.baselines.compile.median_ms, v.timing.median_ms
    conf = Confirmation(rounds=2, candidate_ms=[k, k * 1.1], eager_ms=[e, e], compile_ms=[c, c],
                        speedup_vs_eager=[e / k, e / (k * 1.1)], speedup_vs_compile=[c / k, c / (k * 1.1)])
    r = r.model_copy(update={"verdict": v.model_copy(update={"confirmation": conf})})
    body = pr_body(plan_of(r))
    per_round = ", ".join(f"{x:.2f}x" for x in conf.speedup_vs_faster())
    assert "Timed in 2 alternating rounds (fusebot, eager, torch.compile, ...), one process:" in body
    assert per_round in body
    pooled = r.model_copy(update={"verdict": v.model_copy(update={"confirmation": conf.model_copy(
        update={"processes": 2})})})  # a bench script's two runs, as a PR on CUDA states them
    assert "Timed in 2 alternating rounds (fusebot, eager, torch.compile, ...), 2 processes one after the other:" in \
        pr_body(plan_of(pooled))
    w = rewrite_result()
    w = w.model_copy(update={"verdict": w.verdict.model_copy(update={"confirmation": conf})})
    assert "Timed in 2 alternating rounds (the PyTorch rewrite, eager, torch.compile, ...), one process:" in \
        pr_body(plan_of(w))


def test_a_kernels_block_states_what_a_users_call_costs_beside_the_kernels_own_time():
    """RowGain on the H200: 0.0054 ms for the kernel with flushed caches; a call through the drop-in, back to back,
    0.0304 ms against eager's 0.0385 ms and torch.compile's 0.0606 ms."""
    v = verdict(GPU, ms=0.0054, compile_ms=0.0378)
    b2b = {"timing": 0.0304, "eager": 0.0385, "compile": 0.0606}
    v = v.model_copy(update={
        "timing": v.timing.model_copy(update={"back_to_back_ms": b2b["timing"], "call": "drop-in"}),
        "baselines": Baselines(eager=v.baselines.eager.model_copy(update={"back_to_back_ms": b2b["eager"]}),
                               compile=v.baselines.compile.model_copy(update={"back_to_back_ms": b2b["compile"]}))})
    r = kernel_result(GPU).model_copy(update={"verdict": v})
    table = target_table(r)
    assert "What a user's call costs (the drop-in as shipped, called back to back, host path included): 0.0304 ms " \
        "against 0.0385 ms for eager and 0.0606 ms for torch.compile: **1.27x** over eager; the kernel's own time " \
        "with flushed caches is 0.0054 ms." in table
    assert table in pr_body(plan(r))
    assert "What a user's call costs" not in target_table(kernel_result(GPU))  # not measured: not stated


def test_a_kernel_pr_that_adopts_its_dropin_in_the_modules_file_says_so_and_stays_a_kernel():
    r = kernel_result()
    edit = "class RowGain: ...\n\nfrom fusebot_kernels.row_gain.dropin import adopt as _fusebot_adopt\n"
    adopted = r.model_copy(update={"files": r.files | {"/examples/row_gain.py": edit}})
    bare = r.model_copy(update={"files": {k: v for k, v in adopted.files.items() if k != "row_gain/fusebot.json"}})
    for result in (adopted, bare):  # the manifest says kernel; without it, the drop-in shipped beside says so
        body = pr_body(plan(result))
        assert "Adopt: merge; `examples/row_gain.py` binds `RowGain` to the drop-in" in body
        assert "`FUSEBOT_DISABLE=1` keeps the original class" in body and "fused kernel" in body
        assert "import RowGain` in place of" not in body  # no hand edit asked for
    assert branch_files(plan(adopted))["examples/row_gain.py"] == edit
    assert "import RowGain` in place of" in pr_body(plan(r))  # a PR without the edit: the import to change by hand
