"""Prompts are pure functions of data: what each one must carry, and what it must leave out."""

from __future__ import annotations

from runner.contract import Baselines, BuildInfo, Candidate, Roofline, TrialResult, Verdict
from runner.proposers.llm.facts import requested_flags
from runner.proposers.llm.prompts import (
    MAX_CODE_CHARS,
    SHOW_FAILED,
    ideas_prompt,
    implement_prompt,
    repair_prompt,
    source_filename,
)
from runner.search.types import Attempt, GpuInfo, History, Idea, InputSet, ProblemContext, TensorInfo
from tests.fakes.evaluators import timing

ABI = "#define FB_MAX_DIMS 8 /* the header */"
CTX = ProblemContext(
    name="softmax", reference_source="class Model: ...  # REF", backend="cuda",
    gpu=GpuInfo(name="NVIDIA H100 80GB HBM3", specs="132 SMs, 50 MB L2", copy_bandwidth_bytes_per_s=3.01e12),
    roofline=Roofline(bytes_moved=10**9, bandwidth_bytes_per_s=3.01e12, bandwidth_source="measured", floor_ms=0.332),
    baselines=Baselines(eager=timing(8.64), compile=timing(6.72)),
)


def attempt(ms: float | None, code: str, idea: str = "an idea", reasons: list[str] | None = None) -> Attempt:
    c = Candidate(id=f"c{ms}", format="fast", backend="cuda", sources={"kernel.cu": code})
    v = Verdict(candidate_id=c.id, problem="softmax", accepted=ms is not None, timing=timing(ms) if ms else None,
                reasons=reasons or [], stage="done" if ms else "verify")
    return Attempt(round=1, proposer="m", idea=idea, candidate=c, verdict=v)


def text(messages) -> str:
    return "\n".join(m["content"] for m in messages)


def test_the_first_ideas_prompt_carries_problem_target_floor_and_baselines_and_no_history():
    t = text(ideas_prompt(CTX, History(), 3))
    for must in ("class Model: ...  # REF", "NVIDIA H100 80GB HBM3 (132 SMs, 50 MB L2)", "3.010 TB/s",
                 "Roofline floor: 0.332 ms", "PyTorch eager: median 8.64 ms", "torch.compile: median 6.72 ms",
                 "must beat 6.72 ms", "Propose 3 distinct", "numbered list of exactly 3"):
        assert must in t, must
    assert "Best verified" not in t and "failures" not in t
    assert ideas_prompt(CTX, History(), 3) == ideas_prompt(CTX, History(), 3)  # pure: replay depends on it


def test_history_is_contrastive_best_first_with_code_and_times_slower_variants_and_failures():
    h = History(attempts=[
        attempt(5.0, "// SLOWEST", "two-pass"), attempt(4.5, "// SLOWER"), attempt(3.1, "// BEST", "online softmax"),
        attempt(3.9, "// SECOND"), attempt(4.0, "// THIRD"),
        attempt(None, "// BAD", "shared memory tiles", ["mismatch: output 0: 12 of 4096 elements"]),
        Attempt(round=1, proposer="m", idea="warp shuffles", failure="m: no fenced code block in the answer"),
    ], ideas=[Idea(text="online softmax"), Idea(text="warp shuffles")])
    t = text(implement_prompt(CTX, Idea(text="use float4 loads"), h, ABI, variant=1, variants=2))
    assert t.index("// BEST") < t.index("// SECOND") < t.index("// THIRD") < t.index("Slower verified variants")
    assert "### Best 1: 3.1 ms (IQR 0.062 ms, n=10), 2.17x the faster baseline" in t
    assert "// SLOWER" in t and "// SLOWEST" in t and "what made those faster" in t
    assert "shared memory tiles -> rejected: mismatch: output 0: 12 of 4096 elements" in t
    assert "warp shuffles -> rejected: m: no fenced code block in the answer" in t
    assert "// BAD" not in t  # failed code is not shown outside a repair
    assert "## Task: implement this idea\nuse float4 loads" in t and "variant 2 of 2" in t
    assert ABI in t and "```cuda" in t and "Launch every kernel on `stream`" in t


def test_long_code_is_cut_and_only_recent_failures_are_shown():
    h = History(attempts=[attempt(1.0, "x" * (MAX_CODE_CHARS + 500))]
                + [attempt(None, "", f"failure {k}", [f"build: error {k}"]) for k in range(SHOW_FAILED + 4)])
    t = text(ideas_prompt(CTX, h, 2))
    assert "[... 500 characters cut ...]" in t
    assert f"failure {SHOW_FAILED + 3}" in t and "failure 3 " not in t


def test_a_repair_prompt_carries_the_code_the_reasons_the_compiler_tail_and_failed_trials():
    c = Candidate(id="c", format="fast", backend="cuda", sources={"kernel.cu": "__global__ void k() { FLAOT }"},
                  idea="one block per row")
    log = "warning: noise\n" * 2000 + "kernel.cu(3): error: identifier \"FLAOT\" is undefined"
    v = Verdict(candidate_id="c", problem="softmax", accepted=False, stage="build", reasons=["build: error"],
                build=BuildInfo(ok=False, seconds=1.0, log=log))
    t = text(repair_prompt(CTX, c, v, ABI))
    assert "rejected at the build stage" in t and "FLAOT }" in t and "- build: error" in t
    assert t.count('identifier "FLAOT" is undefined') == 1 and "characters cut" in t  # the tail, where errors are
    assert "one block per row" in t and "whole corrected file" in t and ABI in t
    v2 = Verdict(candidate_id="c", problem="softmax", accepted=False, stage="verify", reasons=["mismatch: bad"],
                 trials=[TrialResult(index=1, shape_set=0, distribution="randn*2+0.5", passed=False, max_abs_err=0.3,
                                     mismatched=7, numel=100, reasons=["mismatch: bad"])])
    t2 = text(repair_prompt(CTX, c, v2, ABI))
    assert "trial 1 (randn*2+0.5): max_abs_err=0.3" in t2 and "mismatched=7/100" in t2
    assert "Compiler output" not in t2


def test_the_format_decides_the_language_and_file():
    cpu = CTX.model_copy(update={"backend": "cpu"})
    kb = CTX.model_copy(update={"format": "kernelbench"})
    assert source_filename(CTX) == "kernel.cu" and source_filename(cpu) == "kernel.cpp"
    assert source_filename(kb) == "candidate.py"
    t = text(implement_prompt(cpu, Idea(text="i"), History(), ABI))
    assert "```cpp" in t and "C++ (.cpp)" in t and "`stream` is NULL" in t
    t = text(implement_prompt(kb, Idea(text="i"), History(), ABI))
    assert "class ModelNew(nn.Module)" in t and ABI not in t


def test_the_search_beam_decides_which_kernels_are_shown_as_best():
    h = History(attempts=[attempt(3.0, "// A"), attempt(2.0, "// B"), attempt(1.0, "// C")], beam=["c1.0"])
    t = text(ideas_prompt(CTX, h, 2))
    assert "### Best 1: 1 ms" in t and "### Best 2" not in t
    assert t.index("Slower verified variants") < t.index("// B") and "// A" in t


def test_the_prompt_carries_the_arguments_of_both_shapes_the_build_the_limits_and_the_timing():
    def t(name, shape, role="input"):
        strides = [shape[1], 1] if len(shape) == 2 else [1]
        return TensorInfo(name=name, shape=shape, dtype="float32", strides=strides, role=role)

    ctx = CTX.model_copy(update={
        "inputs": [InputSet(shape_set=0, tensors=[t("x", [64, 256]), t("bias", [256], "param"),
                                                  t("out0", [64, 256], "output")]),
                   InputSet(shape_set=1, tensors=[t("x", [193, 255]), t("bias", [255], "param"),
                                                  t("out0", [193, 255], "output")])],
        "gpu": CTX.gpu.model_copy(update={"cuda_arch": "sm_90", "sm_count": 132, "smem_per_block_bytes": 232448,
                                          "smem_per_sm_bytes": 233472, "regs_per_sm": 65536,
                                          "max_threads_per_sm": 2048})})
    t_ = text(implement_prompt(ctx, Idea(text="float4 loads"), History(), ABI))
    assert "| in[0] | x | input | float32 | [64, 256] | [256, 1] | 1024 B rows, 16-byte aligned" in t_
    assert "| in[0] | x | input | float32 | [193, 255] | [255, 1] | 1020 B rows, 4-byte aligned |" in t_
    assert "| out[0] | out0 | output |" in t_ and "the second shape (verified, not timed)" in t_
    assert "nvcc -O3 -std=c++17 -shared -Xcompiler -fPIC -gencode=arch=compute_90,code=sm_90" in t_
    assert "// fusebot-flags: fast-math sm_90a" in t_ and "--use_fast_math" in t_
    assert "232448 bytes of shared memory per block" in t_ and "65536 32-bit registers per SM" in t_
    assert "2048 threads per SM" in t_ and "132 SMs" in t_
    assert "L2 is flushed" in t_ and "fresh inputs" in t_ and "host work counts" in t_
    assert "Before the code, write a short performance analysis" in t_
    assert requested_flags("// fusebot-flags: fast-math sm_90a\n// fusebot-flags: -O0 -include x\n", ctx) == [
        "--use_fast_math", "-gencode=arch=compute_90a,code=sm_90a"]
    assert requested_flags("// fusebot-flags: sm_90a fast-math", CTX.model_copy(update={"backend": "cpu"})) == [
        "-ffast-math"]


def test_no_contradictions_the_current_idea_is_not_tried_a_working_idea_is_no_failure_identical_code_once():
    h = History(attempts=[attempt(2.0, "// SAME", "tiles"), attempt(2.2, "// SAME", "tiles again"),
                          attempt(None, "// BAD", "tiles", ["mismatch: x"]),
                          attempt(None, "// BAD2", "atomics", ["mismatch: y"])],
                ideas=[Idea(text="tiles"), Idea(text="float4 loads")])
    t = text(implement_prompt(CTX, Idea(text="float4 loads"), h, ABI))
    assert t.count("// SAME") == 1 and "2 ms" in t and "2.2 ms" not in t
    assert "atomics -> rejected: mismatch: y" in t and "tiles -> rejected" not in t
    tried = t.split("## Ideas already tried")[1]
    assert "- tiles" in tried and "float4 loads" not in tried.split("## Task")[0]
    assert "2 ms (IQR 0.04 ms, n=10), 3.36x the faster baseline, 17% of the roofline floor" in t
