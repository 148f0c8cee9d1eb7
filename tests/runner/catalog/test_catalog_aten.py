"""The core-ATen op set on modules as their users write them: each problem is captured (torch.export, decomposed by
torch's tables), lowered, rendered by the C++ templates and verified by the real harness on the CPU: bf16 loads,
stores and the reference's own rounding points, two outputs of one program, a causal mask from a buffer read as
index arithmetic, slices and a concatenation read in place, a channels-first LayerNorm permuted back, cross-entropy
(a gather and a mean over rows), embeddings, MLPs scheduled as GEMM -> fused program -> GEMM."""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from runner.catalog.codegen import cpu
from runner.catalog.ir import Const, Input, Iota, Op, walk
from runner.catalog.recognition import recognise
from runner.contract import Candidate, Verdict
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import problem_from_file
from runner.proposers.catalog import CatalogProposer, label_of, remember
from runner.search.types import ProblemContext
from tests.runner.catalog.captures import captured
from tests.runner.conftest import FAST_TIMER

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures/problems/catalog_aten"
NAMES = sorted(p.stem for p in FIXTURES.glob("*.py"))

# name -> (family, a phrase the notes must contain, CPU parameter sets to verify); None: not understood, with the
# phrase its reason must contain
EXPECTED = {
    "llama_rmsnorm_bf16": ("row", "rounded to bfloat16", [cpu.CpuParams("rows", "online", "one")]),
    "softmax_fp32_cast_bf16": ("row", "rounded to bfloat16", [cpu.CpuParams("rows", "twopass", "one")]),
    # (two outputs: checked through the ABI below; the harness's timed drop-in module returns one output)
    "prenorm_residual": ("row", "2 outputs from one program", []),
    "causal_softmax": ("row", "causal (lower-triangular) mask", [cpu.CpuParams("rows", "online", "one")]),
    "rope_rotate_half": ("elementwise", "concatenation read in place", [cpu.CpuParams("flat", threads="one")]),
    "channels_first_layernorm": ("row", "the output permuted", [cpu.CpuParams("columns", "online", "one")]),
    "tiled_repeat": ("elementwise", "a repeat read in place", [cpu.CpuParams("flat", threads="one")]),
    "cumulative_sum": (None, "op 'cumsum' is not in the catalog", []),
    "cross_entropy": ("row", "a reduction of reductions", [cpu.CpuParams("rows", "online", "one")]),
    "lm_loss_shifted": ("row", "a reduction of reductions", [cpu.CpuParams("rows", "online", "one")]),
    "lm_loss_padded": ("row", "a constant pad read in place", [cpu.CpuParams("rows", "twopass", "one")]),
    "gpt2_embeddings": ("elementwise", "embedding: loads indexed", [cpu.CpuParams("flat", threads="one")]),
    "masked_mean_pooling": ("row", "sum over dims [1]", [cpu.CpuParams("columns", "online", "one")]),
    "weighted_mse": ("row", "a reduction of reductions", [cpu.CpuParams("rows", "online", "one")]),
    "rope_inv_freq": ("graph", "one fused program", [cpu.CpuParams("flat", threads="one")]),
    "gpt2_mlp": ("graph", "stage 1: one fused program", [cpu.CpuParams("flat", threads="one")]),
    "llama_mlp": ("graph", "stage 2: one fused program", [cpu.CpuParams("flat", threads="one")]),
}


@pytest.fixture(scope="module")
def patterns():
    sources = [(FIXTURES / f"{n}.py").read_text() for n in NAMES]
    pats = {n: recognise(g) for n, g in zip(NAMES, captured(sources), strict=True)}
    for src, n in zip(sources, NAMES, strict=True):
        remember(src, pats[n])
    return pats


def test_every_fixture_has_an_expectation():
    assert sorted(EXPECTED) == NAMES


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_recognised_through_core_aten(patterns, name):
    family, phrase, _ = EXPECTED[name]
    pat = patterns[name]
    if family is None:
        assert pat.family == "unsupported" and phrase in pat.reason, pat.reason
        assert ".py:" in pat.reason  # the source line that made the op
        return
    assert pat.family == family, pat.reason
    assert phrase in " ".join(pat.notes), pat.notes


def test_bf16_rmsnorm_rounds_where_the_reference_does(patterns):
    prog = patterns["llama_rmsnorm_bf16"].program
    rounds = [e for e in walk(prog.out) if isinstance(e, Op) and e.name == "round_bf16"]
    assert rounds and prog.out_dtype == "bfloat16"
    assert {i.dtype for i in prog.inputs} == {"bfloat16"}


def test_causal_mask_is_index_arithmetic_not_a_load(patterns):
    prog = patterns["causal_softmax"].program
    assert all(i.abi == 0 for i in prog.inputs)  # the buffer is never read
    assert {Iota(0), Iota(1)} <= set(walk(prog.out))


def test_causal_softmax_rows_stop_at_their_own_index(patterns):
    prog = patterns["causal_softmax"].program
    assert prog.limit == Op("add", (Iota(1), Const(1.0))) and prog.beyond == 0.0
    src = cpu.render(prog, cpu.CpuParams("rows", "online", "one"))
    assert "r < lim" in src and "r = lim; r < a.R" in src


def test_no_skip_without_a_provable_mask(patterns):
    assert patterns["softmax_fp32_cast_bf16"].program.limit is None


def test_rotate_half_reads_strided_views_of_q(patterns):
    prog = patterns["rope_rotate_half"].program
    views = [i for i in prog.inputs if i.strides is not None]
    assert {i.abi for i in views} >= {0} and any(i.shift and any(i.shift) for i in views)
    assert all(isinstance(i, Input) for i in prog.inputs)


def test_cross_entropy_gathers_the_target_logit_and_averages_the_rows(patterns):
    prog = patterns["cross_entropy"].program
    assert prog.has_totals and prog.axes == (1,) and prog.out_shape == ()
    assert any(type(e).__name__ == "Gather" for e in walk(prog.out))


def test_mlp_is_scheduled_as_gemm_fused_gemm(patterns):
    plan = patterns["gpt2_mlp"].plan
    assert [s.kind for s in plan.stages] == ["heavy", "fused", "heavy"]
    assert [s.node.op for s in plan.stages if s.kind == "heavy"] == ["linear", "linear"]
    plan = patterns["llama_mlp"].plan
    assert [s.kind for s in plan.stages] == ["heavy", "heavy", "fused", "heavy"]


def test_two_outputs_of_one_program_match_torch(patterns, tmp_path):
    """The pre-norm residual's (norm(h) * w, h) from one C++ kernel through the fast ABI, against torch."""
    import subprocess

    import torch

    from runner.harness.build import CPU_FLAGS
    from runner.harness.procs.abi import KernelLibrary

    prog = patterns["prenorm_residual"].program
    assert len(prog.outputs) == 2
    for params in (cpu.CpuParams("rows", "online", "one"), cpu.CpuParams("columns", "twopass", "one")):
        (tmp_path / "k.cpp").write_text(cpu.render(prog, params))
        so = tmp_path / f"k_{params.layout}.so"
        csrc = Path(__file__).resolve().parents[3] / "runner/csrc"
        done = subprocess.run(["g++", *CPU_FLAGS, "-I", str(csrc), "k.cpp", "-o", str(so)], cwd=tmp_path,
                              capture_output=True, text=True)
        assert done.returncode == 0, done.stderr[-2000:]
        gen = torch.Generator().manual_seed(1)
        x, res = torch.randn(6, 10, 96, generator=gen), torch.randn(6, 10, 96, generator=gen)
        w = torch.rand(96, generator=gen) + 0.5
        outs = [torch.empty(6, 10, 96), torch.empty(6, 10, 96)]
        KernelLibrary(so)([x, res, w], outs, None)
        h = x + res
        want = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + 1e-6) * w
        torch.testing.assert_close(outs[0], want, rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(outs[1], h, rtol=0, atol=0)


def test_cpu_candidates_are_verified_by_the_harness(patterns, harness_cache):
    """One Evaluator per problem, every listed parameter set through it; two problems at a time (a problem's time is
    mostly its judge's and candidates' process starts), each with the suite's short timer and a 100 ms timer
    cross-check (its escapes are 10x; tests/runner/harness has its own tests)."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache, cpu_check_ms=100)
    prop = CatalogProposer()
    names = [n for n in sorted(EXPECTED) if EXPECTED[n][2]]

    def verified(name: str) -> list[tuple[Candidate, Verdict]]:
        ctx = ProblemContext(name=name, reference_source=(FIXTURES / f"{name}.py").read_text(), backend="cpu")
        cands: list[Candidate] = [prop.candidate(ctx, patterns[name], p) for p in EXPECTED[name][2]]
        with Evaluator(problem_from_file(FIXTURES / f"{name}.py"), backend="cpu", config=cfg) as ev:
            verdicts = ev.evaluate_many(cands)
            for k, (c, v) in enumerate(zip(cands, verdicts, strict=True)):
                if v.reasons and all(r.startswith("timer-escape") for r in v.reasons):
                    verdicts[k] = ev.evaluate(c)
        return list(zip(cands, verdicts, strict=True))

    with ThreadPoolExecutor(2) as pool:
        results = dict(zip(names, pool.map(verified, names), strict=True))
    for name in names:
        for c, v in results[name]:
            assert v.accepted, (name, label_of(c), v.reasons)


@pytest.mark.parametrize("mode", ["online", "twopass"])
def test_cross_entropy_is_non_finite_where_torchs_is(patterns, tmp_path, mode):
    """A +inf logit makes torch's log-softmax NaN (x - max is inf - inf), so the loss is NaN; a -inf logit at a row's
    first column leaves it finite; a NaN makes it NaN. The online log-sum-exp must give what the two-pass one gives
    (its rescale step once turned a +inf into a loss of +inf), wherever in the row the value sits; and the judge's
    non-finite trial (NaN, +inf and -inf at once) accepts it, on a dozen draws."""
    import subprocess

    import torch

    from runner.harness.build import CPU_FLAGS
    from runner.harness.procs.abi import KernelLibrary
    from tests.runner.nonfinite import judged, nonfinite_inputs

    (tmp_path / "k.cpp").write_text(cpu.render(patterns["cross_entropy"].program, cpu.CpuParams("rows", mode, "one")))
    csrc = Path(__file__).resolve().parents[3] / "runner/csrc"
    done = subprocess.run(["g++", *CPU_FLAGS, "-I", str(csrc), "k.cpp", "-o", "k.so"], cwd=tmp_path,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-2000:]
    kernel = KernelLibrary(tmp_path / "k.so")
    gen = torch.Generator().manual_seed(3)
    labels = torch.randint(0, 300, (24,), generator=gen)
    seen = set()
    for value in (float("inf"), float("-inf"), float("nan")):
        for col in (0, 1, 150, 299):
            logits = torch.randn(24, 300, generator=gen)
            logits[5, col] = value
            out = torch.empty(())
            kernel([logits, labels], [out], None)
            want = torch.nn.functional.cross_entropy(logits.double(), labels).float()
            seen.add(str(float(want)))
            assert torch.allclose(out, want, rtol=1e-5, atol=1e-5, equal_nan=True), (value, col, out, want)
    assert "nan" in seen and any(s != "nan" for s in seen)  # both kinds of row were tried
    model = torch.nn.CrossEntropyLoss()
    for seed in range(12):
        xs = nonfinite_inputs([torch.randn(24, 300, generator=gen), labels], seed)
        out = torch.empty(())
        kernel(xs, [out], None)
        assert judged(model, xs, [out]) == [], seed
