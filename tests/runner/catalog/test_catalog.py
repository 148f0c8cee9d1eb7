"""The builtin catalog: its C++ candidates verified by the real harness on the CPU, every CUDA template instantiation
compiled by nvcc (fp32, fp16, bf16), and the proposer's ideas: deterministic, never a repeat, refining the best."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from runner.catalog.codegen import cpu, cuda
from runner.catalog.ir import Const, Input, Load, Op, Program, Red
from runner.catalog.recognition import recognise
from runner.contract import Candidate, Timing, Verdict
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.pipeline import problem_from_file
from runner.proposers.catalog import CatalogProposer, catalog_proposers, label_of, remember
from runner.search.types import Attempt, History, ProblemContext
from tests.runner.catalog.captures import captured
from tests.runner.catalog.codegen.nvcc import EXPORTS, compile_together
from tests.runner.conftest import FAST_TIMER

CATALOG = Path(__file__).resolve().parents[2] / "fixtures/problems/catalog"
ROOT = Path(__file__).resolve().parents[3]
CSRC = ROOT / "runner/csrc"


@pytest.fixture(scope="module")
def patterns():
    names = sorted(p.stem for p in CATALOG.glob("*.py"))
    sources = [(CATALOG / f"{n}.py").read_text() for n in names]
    pats = {n: recognise(g) for n, g in zip(names, captured(sources), strict=True)}
    for src, n in zip(sources, names, strict=True):
        remember(src, pats[n])  # the proposers below reuse these captures instead of capturing again
    return pats


def ctx(name: str, backend: str = "cpu") -> ProblemContext:
    return ProblemContext(name=name, reference_source=(CATALOG / f"{name}.py").read_text(), backend=backend)


# ---- C++ candidates through the real harness -------------------------------------------------------------------

# problem -> the CPU parameter sets to verify: every layout, both modes, a fast-math variant, broadcast indexing, a
# grouped view, a full reduction, a product and an index output (batch norm shares channel_affine's template and
# broadcast; diag(a) @ B is checked by its recognition); one thread each (OpenMP variants only render and compile
# here: on a small shared CI machine their timings are too erratic for the harness's timer cross-check).
VERIFY = {
    "ew_broadcast": [cpu.CpuParams("flat", threads="one")],
    "channel_affine": [cpu.CpuParams("flat", threads="one")],
    "gemm_to_constant": [cpu.CpuParams("flat", threads="one")],  # a GEMM folded away: a kernel with no inputs
    "prod_dim": [cpu.CpuParams("rows", "online", "one")],
    "mingpt_gelu": [cpu.CpuParams("flat", threads="one", fast_math=True)],
    "softmax": [cpu.CpuParams("rows", "online", "one"), cpu.CpuParams("rows", "twopass", "one")],
    "layernorm": [cpu.CpuParams("rows", "online", "one")],
    "groupnorm": [cpu.CpuParams("rows", "twopass", "one")],
    "rmsnorm": [cpu.CpuParams("columns", "online", "one")],
    "argmax": [cpu.CpuParams("rows", "online", "one")],
    "frobenius": [cpu.CpuParams("rows", "twopass", "one")],
    "hinge_rows": [cpu.CpuParams("rows", "online", "one")],  # targets repeating inside each row (rowper)
}


# A fold valid on finite inputs only: gemm_to_constant's output is 0 for every finite x (a max minus its own mean),
# NaN where x holds a NaN or an infinity. The module's output is the same whatever finite value x holds, so the judge
# counts x's NaN and infinities as discarded by the module (runner.harness.procs.judge.masked_twin): the catalog's
# constant kernel is accepted, and its verdict says so.
FINITE_ONLY = {"gemm_to_constant"}


def _verify(problem: str, cands: list[Candidate], cache: Path) -> list[Verdict]:
    """The harness's verdicts; a verdict whose only reason is the timer cross-check is measured once more (on an
    overloaded CI machine a preempted process can fail it honestly; correctness is never retried)."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=cache)
    with Evaluator(problem_from_file(CATALOG / f"{problem}.py"), backend="cpu", config=cfg) as ev:
        verdicts = ev.evaluate_many(cands)
        for k, (c, v) in enumerate(zip(cands, verdicts, strict=True)):
            if v.reasons and all(r.startswith("timer-escape") for r in v.reasons):
                verdicts[k] = ev.evaluate(c)
        return verdicts


def _broken_softmax(patterns) -> Candidate:
    """softmax's two-pass kernel with every output halved: a wrong template."""
    good = CatalogProposer().candidate(ctx("softmax"), patterns["softmax"], cpu.CpuParams("rows", "twopass", "one"))
    src = good.sources["kernel.cpp"]
    assert "fb_exp(" in src
    return good.model_copy(update={"id": "broken-softmax",
                                   "sources": {"kernel.cpp": src.replace("y[flat] = (float)", "y[flat] = 0.5f * (float)")}})


@pytest.fixture(scope="module")
def verified(patterns, harness_cache):
    """problem -> [(candidate, verdict)] for VERIFY's parameter sets, each problem's candidates through one Evaluator
    once (softmax's with the wrong template of test_a_wrong_template_is_rejected_by_the_harness beside them: one judge
    serves both tests; every candidate still gets its own process and its own verdict)."""
    seen: dict[str, list[tuple[Candidate, Verdict]]] = {}

    def of(problem: str) -> list[tuple[Candidate, Verdict]]:
        if problem not in seen:
            prop = CatalogProposer()
            cands = [prop.candidate(ctx(problem), patterns[problem], p) for p in VERIFY[problem]]
            if problem == "softmax":
                cands.append(_broken_softmax(patterns))
            seen[problem] = list(zip(cands, _verify(problem, cands, harness_cache), strict=True))
        return seen[problem]

    return of


@pytest.mark.parametrize("problem", sorted(VERIFY))
def test_cpu_candidates_are_verified_by_the_harness(verified, problem):
    results = [(c, v) for c, v in verified(problem) if c.id != "broken-softmax"]
    assert [label_of(c) for c, _ in results] == [p.label() for p in VERIFY[problem]]
    for c, v in results:
        if problem in FINITE_ONLY:  # right on every finite input; the module's NaN comes of inputs it discards
            assert v.accepted and all(t.passed for t in v.trials), (label_of(c), v.reasons)
            assert any(w.startswith("masked non-finite") for w in v.warnings), v.warnings
            continue
        assert v.accepted, (label_of(c), v.reasons)
        assert v.timing.median_ms > 0 and all(t.passed for t in v.trials)


def test_a_wrong_template_is_rejected_by_the_harness(verified):
    """The harness is the judge of the templates: a softmax with its max subtracted twice must fail verification."""
    (v,) = [v for c, v in verified("softmax") if c.id == "broken-softmax"]
    assert not v.accepted and any("mismatch" in r for r in v.reasons), v.reasons


@pytest.mark.slow
@pytest.mark.parametrize("problem", ["linear_epilogue", "matmul_t_rowsum"])
def test_epilogue_candidate_runs_torch_for_the_gemm_and_a_fused_cpu_extension(patterns, problem, harness_cache):
    prop = CatalogProposer()
    pat = patterns[problem]
    params = cpu.CpuParams("flat" if pat.program.split()[1] == 1 and not pat.program.is_row else "rows", threads="one")
    c = prop.candidate(ctx(problem), pat, params)
    src = c.sources["candidate.py"]
    assert c.format == "kernelbench" and ("functional.linear(t[0], t[2], t[3])" in src or "torch.matmul(t[0], t[1].T)" in src)
    (v,) = _verify(problem, [c], harness_cache)
    assert v.accepted, v.reasons


_UNDEF = ("FB_NIN", "FB_ND", "FB_FAST", "FB_FAST_EXP", "FB_FAST_DIV", "FB_FAST_LOG", "FB_HD", "FB_M")
# (CUDA sources also put their helper templates and statics in the namespace: they compile the same way)


def one_translation_unit(sources: list[str]) -> str:
    """Many fast-format C++ sources as one file (each in its own namespace, its exports renamed), so one compiler
    run checks them all: the headers are parsed once instead of a hundred times."""
    head = [line for line in sources[0].splitlines() if line.startswith("#include")]
    parts = ["\n".join(head)]
    for k, src in enumerate(sources):
        parts.append("".join(f"#define {e} {e}_{k}\n" for e in EXPORTS) + f"namespace cand{k} {{\n{src}\n}}\n"
                     + "".join(f"#undef {m}\n" for m in (*EXPORTS, *_UNDEF)))
    return "\n".join(parts)


def test_every_cpu_strategy_of_every_fixture_compiles(patterns, tmp_path):
    """Every C++ parameter set the catalog can propose for the fixtures compiles with the harness's own flags."""
    from runner.harness.build import toolchain

    prop = CatalogProposer()
    sources = []
    for name, pat in patterns.items():
        for s in prop.strategies(ctx(name)):
            for p in s.params:
                c = prop.candidate(ctx(name), pat, p)
                assert label_of(c) == p.label()
                if c.format == "fast":
                    sources.append(c.sources["kernel.cpp"])
    assert len(sources) > 60
    tc = toolchain("cpu")
    (tmp_path / "all.cpp").write_text(one_translation_unit(sources))
    flags = [f for f in tc.flags if f != "-O3"] + ["-O0"]  # compile-only: optimisation adds nothing to the check
    proc = subprocess.run([tc.compiler, *flags, "-I", str(CSRC), "all.cpp", "-o", "all.so"], cwd=tmp_path,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]


# ---- CUDA templates: every instantiation compiles with nvcc (compile only) ------------------------------------------


def _as_dtype(prog: Program, dtype: str) -> Program:
    ins = [Input(i.abi, i.shape, dtype if i.dtype == "float32" else i.dtype, i.viewed) for i in prog.inputs]
    out = dtype if prog.out_dtype == "float32" else prog.out_dtype
    return replace(prog, inputs=ins, out_dtype=out)


CUDA_CASES = [  # (fixture, params): every layout, both modes, vector widths, fast math, an epilogue (the general-index
    # flat kernels are compiled as the bcast source's fall-back)
    ("mingpt_gelu", cuda.CudaParams("flat", vec=4, threads=256, grid="stride")),
    ("mingpt_gelu", cuda.CudaParams("flat", vec=2, threads=128, grid="once", unroll=2, fast_math=True)),
    ("softmax", cuda.CudaParams("rows", vec=4, threads=256, group=32, mode="online")),
    ("softmax", cuda.CudaParams("rows", vec=4, threads=512, group=0, mode="twopass", fast_math=True)),
    ("layernorm", cuda.CudaParams("split", vec=4, threads=256, slices=16, mode="online")),
    ("layernorm", cuda.CudaParams("rows", vec=2, threads=1024, group=0, mode="twopass")),
    ("rmsnorm", cuda.CudaParams("columns", vec=1, threads=256, col_width=32, slices=8)),
    ("argmax", cuda.CudaParams("split", vec=4, threads=256, slices=8)),
    ("sum_dim", cuda.CudaParams("columns", vec=1, threads=64, col_width=64, slices=1)),
    ("linear_epilogue", cuda.CudaParams("flat", vec=4, threads=256)),
    ("log_softmax", cuda.CudaParams("rows", vec=4, threads=256, group=0, mode="online")),
    ("instancenorm", cuda.CudaParams("rows", vec=4, threads=128, group=32, mode="twopass")),
    ("logsumexp_max", cuda.CudaParams("split", vec=4, threads=512, slices=4, mode="online", fast_math=True)),
    ("frobenius", cuda.CudaParams("split", vec=4, threads=256, slices=64, mode="twopass")),
    ("frobenius", cuda.CudaParams("split", vec=4, threads=512, slices=264, unroll=2, interleave=True)),
    ("frobenius", cuda.CudaParams("split", vec=4, threads=512, slices=264, unroll=2, interleave=True, grid="once")),
    ("layernorm", cuda.CudaParams("split", vec=4, threads=256, slices=16, mode="twopass", unroll=4, grid="once")),
    ("argmax", cuda.CudaParams("split", vec=4, threads=128, slices=16, interleave=True)),
    ("layernorm", cuda.CudaParams("split", vec=4, threads=512, slices=16, unroll=4)),  # rowvec loads hoisted too
    ("rmsnorm", cuda.CudaParams("columns", vec=1, threads=512, col_width=64, slices=8, unroll=4)),
    ("softmax", cuda.CudaParams("cluster", vec=4, threads=512, slices=16, mode="online")),
    ("argmax", cuda.CudaParams("cluster", vec=4, threads=256, slices=1, mode="online")),
    ("layernorm", cuda.CudaParams("cluster", vec=2, threads=1024, slices=2, mode="twopass", fast_math=True)),
    ("channel_affine", cuda.CudaParams("bcast", vec=4, threads=128, grid="stride", unroll=2)),  # [N, C, HW]
    ("layernorm", cuda.CudaParams("grid", vec=4, threads=256, slices=8, mode="online", buffers=1)),
    ("argmax", cuda.CudaParams("grid", vec=4, threads=128, slices=3, mode="online", unroll=2)),  # a per-row output
    ("softmax", cuda.CudaParams("grid", vec=4, threads=512, slices=16, mode="twopass", fast_math=True)),
    ("log_softmax", cuda.CudaParams("grid", vec=4, threads=256, slices=8, mode="twopass", buffers=1)),
    ("rmsnorm", cuda.CudaParams("columns", vec=4, threads=256, col_width=32, slices=8)),
    ("rmsnorm", cuda.CudaParams("columns", vec=4, threads=512, col_width=64, slices=8, unroll=4, mode="twopass")),
    ("sum_dim", cuda.CudaParams("columns", vec=4, threads=64, col_width=64, slices=1)),  # a per-row output, no merge
    ("sum_dim", cuda.CudaParams("columns", vec=2, threads=512, col_width=32, slices=16, unroll=2)),
    # rowblock inputs (a GroupNorm's weight and bias): a value per vector, or (after a GEMM) a vector of their own
    ("groupnorm_runs", cuda.CudaParams("split", vec=4, threads=256, slices=4, mode="twopass", unroll=4)),
    ("groupnorm_runs", cuda.CudaParams("cluster", vec=2, threads=128, slices=2, mode="twopass")),
    ("gemm_groupnorm", cuda.CudaParams("grid", vec=4, threads=128, slices=2, mode="online")),
    # the first pass taking the slice part by part as it lands (one buffer)
    ("groupnorm_runs", cuda.CudaParams("grid", vec=4, threads=256, slices=4, mode="twopass", buffers=1, chunks=4)),
    ("softmax", cuda.CudaParams("grid", vec=4, threads=256, slices=16, mode="online", buffers=1, chunks=8)),
    ("instancenorm", cuda.CudaParams("cluster", vec=2, threads=128, slices=4, mode="twopass", buffers=1, chunks=4)),
    ("softmax", cuda.CudaParams("cluster", vec=1, threads=256, slices=4, mode="twopass", buffers=1)),  # 4-wide middle
    ("argmax", cuda.CudaParams("grid", vec=1, threads=128, slices=4, mode="online", buffers=1)),
    ("log_softmax", cuda.CudaParams("cluster", vec=4, threads=256, slices=2, mode="online", buffers=1, chunks=2)),
    ("gemm_groupnorm", cuda.CudaParams("rows", vec=4, threads=128, group=32, mode="online", fast_math=True)),
    # short rows held in registers, groups of 8 lanes (rowblock inputs read by index)
    ("gemm_groupnorm", cuda.CudaParams("regs", vec=4, threads=256, group=8, mode="twopass")),
    ("gemm_groupnorm", cuda.CudaParams("regs", vec=4, threads=128, group=8, mode="twopass", fast_math=True)),
    ("gemm_groupnorm", cuda.CudaParams("regs", vec=4, threads=128, group=0, mode="online")),
    # rowper inputs (targets repeating inside a row): a vector of their own at r % M
    ("hinge_loss", cuda.CudaParams("split", vec=4, threads=512, slices=64, unroll=2, interleave=True)),
    ("hinge_rows", cuda.CudaParams("rows", vec=4, threads=256, group=32, mode="online")),
    ("hinge_rows", cuda.CudaParams("grid", vec=4, threads=128, slices=2, mode="online", fast_math=True)),
    # a middle dim whose inner size is not whole vectors: V-wide loads at a stride of V rows
    ("argmax_middle", cuda.CudaParams("strided", vec=4, threads=256, slices=4, unroll=8)),
    ("mean_middle", cuda.CudaParams("strided", vec=2, threads=128, slices=2, unroll=1)),
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_every_cuda_template_instantiation_compiles(patterns, tmp_path):
    jobs = []
    for name, params in CUDA_CASES:
        pat = patterns[name]
        for dtype in ("float32", "float16", "bfloat16"):
            prog = _as_dtype(pat.program, dtype)
            p = params if dtype == "float32" or params.vec == 1 else replace(params, vec=min(8, params.vec * 2))
            src = cuda.render(prog, p, abi_offset=1 if pat.family == "epilogue" else 0)
            jobs.append((f"{name}-{p.label()}-{dtype}", src))
    assert len(jobs) == 3 * len(CUDA_CASES)
    rc, log = compile_together([src for _, src in jobs], tmp_path, names=[name for name, _ in jobs])
    assert rc == 0, log[:3000]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name,params,vec_store", [
    ("softmax", cuda.CudaParams("cluster", vec=4, threads=256, slices=16, mode="twopass", buffers=1), "v4"),
    ("softmax", cuda.CudaParams("cluster", vec=2, threads=256, slices=16, mode="twopass", buffers=1), "v2"),
    ("layernorm", cuda.CudaParams("rows", vec=4, threads=256, group=0, mode="online"), "v4"),
])
def test_a_vector_kernels_output_is_stored_whole_vectors_at_a_time(patterns, tmp_path, name, params, vec_store):
    """The output of a V-wide kernel leaves in V-wide stores (PTX st.global.v4/.v2): an FbVec assigned through a
    pointer was split by nvcc into one st.global.f32 per element, which cost the H100's on-chip softmax 6.5 against
    4.8 ms. The kernels checked store nothing else to global memory."""
    src = cuda.render(patterns[name].program, params)
    (tmp_path / "k.cu").write_text(src)
    p = subprocess.run(["nvcc", "-O3", "-std=c++17", "-ptx", "-arch=sm_90", "-I", str(CSRC), "k.cu", "-o", "k.ptx"],
                       cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    ptx = (tmp_path / "k.ptx").read_text()

    def name(entry: str) -> str:  # _Z13fb_cluster_v46FbArgsxxi: the length-prefixed C++ name
        m = re.match(r"_Z(\d+)", entry)
        return entry[m.end():m.end() + int(m.group(1))] if m else entry.split("(")[0]

    kernel = f"_v{params.vec}"
    bodies = [b for b in ptx.split(".entry ")[1:] if name(b).endswith(kernel)]
    assert bodies, f"no kernel ending in {kernel}"
    stores = [ln.split()[0] for b in bodies for ln in b.splitlines() if ln.strip().startswith("st.global")]
    assert stores and all(s.startswith(f"st.global.{vec_store}") for s in stores), sorted(set(stores))


def _mid(out, extra=(), out_dtype="float32", keep=False) -> Program:
    """A reduction over the middle dim of x[8, 36, 45] (45 columns: no vector width divides a row)."""
    shape = (8, 36, 45)
    return Program(inputs=[Input(0, shape, "float32"), *extra], out=out, shape=shape, axes=(1,), out_dtype=out_dtype,
                   out_shape=shape if keep else (8, 45))


X = Load(0)
# the columns template over every kind of accumulator, finished value and input: log-sum-exp (a value of pass 1 read
# by pass 2 in two-pass mode), mean and variance (Welford), an index output, and a row vector, an outer input and a
# scalar read per lane beside the vector loads
MID_COLUMNS = [
    _mid(Op("exp", (Op("sub", (X, Red("lse", X))),)), keep=True),
    _mid(Op("div", (Op("sub", (X, Red("mean", X))), Op("sqrt", (Op("add", (Red("var", X), Const(1e-5))),)))), keep=True),
    _mid(Op("add", (Op("mul", (Op("mul", (X, Load(1))), Red("max", X))), Op("mul", (Load(2), Load(3))))),
         extra=(Input(1, (36, 1), "float32"), Input(2, (8, 1, 45), "float32"), Input(3, (), "float32")), keep=True),
    _mid(Red("argmax", X), out_dtype="int64"),
    _mid(Op("add", (Red("sum", X), Load(1))), extra=(Input(1, (8, 1, 45), "float32"),)),
]


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_columns_kernels_of_every_accumulator_and_input_kind_compile(tmp_path):
    sources = []
    for prog in MID_COLUMNS:
        for dtype, vec, mode in (("float32", 4, "online"), ("float16", 8, "twopass")):
            params = cuda.CudaParams("columns", vec=vec, threads=256, col_width=32, slices=8, mode=mode, unroll=4)
            sources.append(cuda.render(_as_dtype(prog, dtype), params))
    rc, log = compile_together(sources, tmp_path)
    assert rc == 0, log[:3000]


def test_columns_runs_its_vector_kernel_only_on_whole_aligned_vectors():
    """The V-wide columns kernel loads and stores V columns at once: the launcher takes it only when a row of the inner
    dim is whole vectors and every vector pointer (the full inputs, the output) is aligned, else the scalar kernel;
    other inputs are read per column (lane) in both."""
    import re

    prog = MID_COLUMNS[2]  # x (full), a row vector, an outer input, a scalar
    src = cuda.render(prog, cuda.CudaParams("columns", vec=4, threads=256, col_width=32, slices=8))
    wide = re.search(r"const bool wide = 4 > 1 && \((.*)\);", src)
    assert wide, src[-2000:]
    assert set(wide.group(1).split(" && ")) == {"fb_aligned(a.in[0], 4 * (int)sizeof(float))",
                                                 "fb_aligned(a.out, 4 * (int)sizeof(float))", "a.I % 4 == 0"}
    assert "const long long width = wide ? 128 : 32;" in src  # 32 threads across, 4 columns each
    assert re.search(r"if \(wide\) fb_cols_v4<<<.*\n\s*else fb_cols_v1<<<", src)
    v1, v4 = src.split("fb_cols_v1(FbArgs a)")[1].split("fb_cols_v4(FbArgs a)")
    assert "fb_ldv" not in v1 and "FbVec<float, 1>" in v1
    assert v4.count("fb_ldv<float, 4>((const float*)a.in[0] + base)") == 2  # the pass and the output
    for v in (v1, v4):  # the others per lane, at its own column i (o * a.I + i) or reduced index r
        assert "a.in[1])[r]" in v and "a.in[2])[(o * a.I + i)]" in v and "a.in[3])[0]" in v
    scalar = cuda.render(prog, cuda.CudaParams("columns", vec=1, threads=256, col_width=32, slices=8))
    assert "fb_cols_v4" not in scalar and "fb_cols_v1<<<" in scalar


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_columns_shared_memory_bound_knows_every_accumulator_size(tmp_path):
    """render_columns refuses V x threads accumulators beyond static shared memory from a table of their sizes: the
    table must name every accumulator and its size as compiled with the GPU's fb_acc (float)."""
    import re

    from runner.catalog.codegen.cuda.columns import ACC_BYTES as _ACC_BYTES
    from runner.catalog.codegen.used import ACCUMULATORS

    assert set(_ACC_BYTES) == set(re.findall(r"struct (Acc\w+)", ACCUMULATORS))
    checks = "".join(f'static_assert(sizeof({k}) == {n}, "{k}");\n' for k, n in _ACC_BYTES.items())
    (tmp_path / "acc.cpp").write_text("#include <math.h>\n#define FB_M inline\ntypedef float fb_acc;\n"
                                      "static inline float fb_exp(float x) { return expf(x); }\n"
                                      "static inline fb_acc fb_rcp(fb_acc x) { return 1 / x; }\n"
                                      + ACCUMULATORS + checks)
    p = subprocess.run(["g++", "-std=c++17", "-fsyntax-only", str(tmp_path / "acc.cpp")], capture_output=True, text=True)
    assert p.returncode == 0, p.stderr[-2000:]


def test_every_cuda_template_declares_the_kernels_it_launches(patterns):
    """The harness's no-kernel check looks for the declared kernels in the profiler's trace: every kernel a catalog
    source launches must be found by runner.harness.procs.profile (the first H100 run rejected every catalog kernel when the
    declaration `__global__ void __launch_bounds__(T) name` was not recognised)."""
    import re

    from runner.harness.procs.profile import declared_kernels

    for name, params in CUDA_CASES:
        pat = patterns[name]
        src = cuda.render(pat.program, params, abi_offset=1 if pat.family == "epilogue" else 0)
        launched = set(re.findall(r"(\w+)\s*<<<", src))  # and a cluster launch's `kern = wide ? A : B`:
        launched |= {n for pair in re.findall(r"\?\s*(fb_\w+)\s*:\s*(fb_\w+)", src) for n in pair}
        declared = set(declared_kernels({"kernel.cu": src}))
        assert launched and launched <= declared, (name, params.label(), launched - declared)


def _structure(p: cuda.CudaParams) -> tuple:
    """What changes the generated code's shape (the rest are constants in it)."""
    # (fast math swaps the math functions every template shares: bcast's are flat's, checked with flat's)
    return (p.layout, p.mode if p.layout not in ("flat", "bcast") else "",
            p.fast_math and p.layout not in ("cluster", "bcast"),
            p.group == 32 if p.layout == "rows" else None,
            p.slices == 1 if p.layout == "columns" else None, p.vec == 1)


def _aspects(p: cuda.CudaParams) -> set[tuple]:
    """The code shapes a parameter set instantiates: its structure, and for split how blocks share a row (a chunk
    each or taking turns; partials merged by every thread or by the block), which does not depend on the rest."""
    out = {_structure(p)}
    if p.layout == "split":
        out.add(("split-slices", p.interleave, p.slices > 32, p.vec == 1))
        out.add(("split-output", p.grid == "once"))
    return out


def test_the_compiled_cases_cover_every_structure_the_catalog_proposes(patterns):
    prop = CatalogProposer()
    proposed = {a for n in patterns for s in prop.strategies(ctx(n, "cuda")) for p in s.params for a in _aspects(p)}
    covered = {a for _, p in CUDA_CASES for a in _aspects(p)}
    # vec=1 variants are the same kernels as the wide ones' scalar fall-back (always compiled alongside)
    missing = {s for s in proposed - covered if not s[-1] or (*s[:-1], False) not in covered}
    assert not missing, missing


def test_cuda_strategies_cover_the_row_shapes(patterns):
    """Few long rows start with several blocks per row; many short rows with a warp per row; a middle dim with
    columns; elementwise programs with broadcast inputs with the broadcast layout; fp16 widens vectors to 8."""
    prop = CatalogProposer()
    first = {n: prop.strategies(ctx(n, "cuda"))[0].key for n in ("softmax", "rmsnorm", "mingpt_gelu", "frobenius")}
    assert first == {"softmax": "cuda-rows-split", "rmsnorm": "cuda-columns-online", "mingpt_gelu": "cuda-flat-vector",
                     "frobenius": "cuda-rows-split"}
    bc = {n: prop.strategies(ctx(n, "cuda"))[0] for n in ("diag_matmul", "ew_broadcast", "channel_affine")}
    assert {s.key for s in bc.values()} == {"cuda-flat-broadcast"}  # broadcast inputs: no index division first
    half = _as_dtype(patterns["layernorm"].program, "float16")
    from runner.catalog.space import strategies

    assert max(p.vec for s in strategies(half, "cuda") for p in s.params) == 8
    assert "fb_f16" in cpu.render(half, cpu.CpuParams("rows"))  # fp16 storage on the CPU backend too


def test_a_few_long_rows_with_a_full_output_merge_their_partials_once_first(patterns):
    """Frobenius (one row, an output per element): the output pass as a tile per block after one merge kernel, first;
    a per-row output (hinge loss) has no output pass, and many rows (layernorm's) keep the merge in every block."""
    prop = CatalogProposer()

    def split_sets(name):
        return [p for s in prop.strategies(ctx(name, "cuda")) for p in s.params if p.layout == "split"]

    frob = split_sets("frobenius")
    assert frob[0].grid == "once" and frob[0].interleave
    assert {p.grid for p in frob} == {"once", "stride"}  # the per-block merge follows
    assert "-once" in frob[0].label()
    assert all(p.grid == "stride" for n in ("hinge_loss", "layernorm") for p in split_sets(n))


def test_eight_rows_or_more_try_a_chunk_per_block_then_its_turn_taking_twin(patterns):
    """Rows enough for a chunk per block (layernorm's fixture) start with it, and the same set taking turns along the
    row comes second; a few rows (frobenius, hinge_loss) take turns from the first set on."""
    prop = CatalogProposer()

    def split_sets(name):
        return next(s.params for s in prop.strategies(ctx(name, "cuda")) if s.key == "cuda-rows-split")

    ln = split_sets("layernorm")
    assert len(ln) > 2 and not ln[0].interleave and ln[1] == replace(ln[0], interleave=True)
    assert sum(p.interleave for p in ln) == 1
    assert all(p.interleave for n in ("frobenius", "hinge_loss") for p in split_sets(n))


# ---- the proposer --------------------------------------------------------------------------------------------------


def _accepted(c: Candidate, ms: float) -> Attempt:
    t = Timing(median_ms=ms, iqr_ms=0.0, mean_ms=ms, min_ms=ms, n=5, samples_ms=[ms] * 5, clock="monotonic",
               l2_flushed=False)
    v = Verdict(candidate_id=c.id, problem="softmax", accepted=True, timing=t)
    return Attempt(round=1, proposer="catalog", idea="", candidate=c, verdict=v)


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_ideas_are_deterministic_distinct_and_never_repeat_a_parameter_set(patterns, backend):
    c = ctx("softmax", backend)
    a, b = CatalogProposer(), CatalogProposer()
    h = History()
    ideas_a, ideas_b = a.ideas(c, h, 3), b.ideas(c, h, 3)
    assert [i.text for i in ideas_a] == [i.text for i in ideas_b] and len(ideas_a) == 3
    assert len({i.text for i in ideas_a}) == 3
    seen: set[str] = set()
    for rnd in range(1, 4):
        for idea in a.ideas(c, h, 3):
            cands = a.implement(c, idea, h, 2)
            labels = [label_of(x) for x in cands]
            assert len(set(labels)) == len(labels) and not (set(labels) & seen), (rnd, labels, seen)
            seen |= set(labels)
            h.attempts += [_accepted(x, 1.0 + 0.1 * len(seen)) for x in cands]
    assert len(seen) >= 8


def test_a_family_with_one_strategy_still_fills_a_round(patterns):
    c = ctx("rmsnorm", "cuda")  # a middle-dim reduction: one strategy (columns)
    prop = CatalogProposer()
    assert len(prop.strategies(c)) == 1
    ideas = prop.ideas(c, History(), 4)
    assert len(ideas) == 4
    labels = [label_of(x) for i in ideas for x in prop.implement(c, i, History(), 2)]
    assert len(labels) == 8 and len(set(labels)) == 8


def test_later_rounds_refine_around_the_fastest_kernel(patterns):
    c = ctx("softmax", "cuda")
    prop = CatalogProposer()
    h = History()
    first = prop.ideas(c, h, 2)
    cands = prop.implement(c, first[0], h, 2)
    h.attempts += [_accepted(cands[0], 2.0), _accepted(cands[1], 1.0)]  # the second is the fastest
    ideas = prop.ideas(c, h, 2)
    best = label_of(cands[1])
    assert "Refine the fastest kernel so far" in ideas[0].text and best in ideas[0].text
    near = prop.implement(c, ideas[0], h, 8)
    assert near and best not in {label_of(x) for x in near}
    base = prop._by_label[best]
    changed = {sum(getattr(prop._by_label[label_of(x)], f) != getattr(base, f) for f in vars(base)) for x in near}
    assert changed <= {1, 2}  # one parameter at a time (threads follow the columns' shape)


def test_unsupported_problem_gives_no_ideas_and_repair_gives_none(tmp_path):
    src = "import torch\nimport torch.nn as nn\n\nclass Model(nn.Module):\n    def forward(self, x):\n" \
          "        return torch.cumsum(x, 0)\n\ndef get_inputs():\n    return [torch.randn(4, 4)]\n\n" \
          "def get_init_inputs():\n    return []\n"
    c = ProblemContext(name="cumsum", reference_source=src, backend="cpu")
    prop = catalog_proposers()[0]
    assert prop.ideas(c, History(), 4) == []
    assert "cumsum" in prop.pattern(c).reason
    dummy = Candidate(id="x", format="fast", backend="cpu", sources={"kernel.cpp": ""})
    assert prop.repair(c, dummy, Verdict(candidate_id="x", problem="cumsum", accepted=False)) is None


# ---- on the H100 (run by hand: pytest -m gpu) ------------------------------------------------------------------------

GPU_CASES = {
    "softmax": [cuda.CudaParams("rows", vec=4, threads=256, group=32, mode="online"),
                cuda.CudaParams("rows", vec=4, threads=512, group=0, mode="twopass"),
                cuda.CudaParams("split", vec=4, threads=256, slices=8, mode="online")],
    "layernorm": [cuda.CudaParams("rows", vec=4, threads=256, group=0, mode="online"),
                  cuda.CudaParams("split", vec=4, threads=256, slices=16, mode="twopass"),
                  cuda.CudaParams("split", vec=4, threads=128, slices=16, unroll=4),  # a slice's tail inside a step
                  cuda.CudaParams("split", vec=4, threads=64, slices=40, mode="twopass"),  # Welford partials, block-merged
                  cuda.CudaParams("split", vec=4, threads=128, slices=16, interleave=True),  # taking turns along a row
                  # a row on chip across a group of blocks: weight and bias read per slice; two passes' partials
                  cuda.CudaParams("grid", vec=4, threads=256, slices=8, mode="online", buffers=1),
                  cuda.CudaParams("grid", vec=4, threads=64, slices=5, mode="twopass")],
    "rmsnorm": [cuda.CudaParams("columns", vec=1, threads=256, col_width=32, slices=8),
                cuda.CudaParams("columns", vec=1, threads=32, col_width=32, slices=1),
                cuda.CudaParams("columns", vec=1, threads=256, col_width=32, slices=8, unroll=4, mode="twopass"),
                cuda.CudaParams("columns", vec=4, threads=256, col_width=32, slices=8),  # 120 columns: whole float4s
                cuda.CudaParams("columns", vec=4, threads=256, col_width=32, slices=8, unroll=4, mode="twopass"),
                cuda.CudaParams("columns", vec=4, threads=64, col_width=64, slices=1)],
    "sum_dim": [cuda.CudaParams("columns", vec=4, threads=256, col_width=32, slices=8),  # a per-row output, 4 wide
                cuda.CudaParams("columns", vec=2, threads=512, col_width=32, slices=16, unroll=4)],
    "ew_broadcast": [cuda.CudaParams("flat", vec=4, threads=256), cuda.CudaParams("flat", vec=1, threads=128),
                     cuda.CudaParams("bcast", vec=4, threads=256, grid="once", unroll=2),
                     cuda.CudaParams("bcast", vec=4, threads=128, grid="stride", unroll=4, fast_math=True)],
    "channel_affine": [cuda.CudaParams("bcast", vec=4, threads=256, grid="stride", unroll=2)],
    "diag_matmul": [cuda.CudaParams("bcast", vec=4, threads=256, grid="once", unroll=4)],
    "mingpt_gelu": [cuda.CudaParams("flat", vec=4, threads=256, grid="once", unroll=4),
                    cuda.CudaParams("flat", vec=4, threads=512, grid="stride", unroll=2, fast_math=True)],
    "argmax": [cuda.CudaParams("rows", vec=4, threads=256, group=32),
               cuda.CudaParams("split", vec=4, threads=256, slices=4),
               # blocks taking turns along a row of 300 (most of the 64 see nothing), their partials merged by a block
               cuda.CudaParams("split", vec=4, threads=32, slices=64, interleave=True),
               cuda.CudaParams("columns", vec=1, threads=256, col_width=32, slices=8, unroll=4),
               cuda.CudaParams("columns", vec=4, threads=256, col_width=32, slices=8),  # I = 1: the scalar fall-back
               cuda.CudaParams("cluster", vec=4, threads=128, slices=2, buffers=1),  # partials merged across blocks
               cuda.CudaParams("grid", vec=4, threads=64, slices=3, unroll=2)],  # an index per row from slice 0
    "frobenius": [cuda.CudaParams("split", vec=4, threads=256, slices=64),
                  cuda.CudaParams("split", vec=4, threads=128, slices=48, unroll=2, interleave=True),
                  # the partials merged once, then the output pass a tile per block (odd shapes: the scalar one)
                  cuda.CudaParams("split", vec=4, threads=128, slices=48, unroll=2, interleave=True, grid="once"),
                  cuda.CudaParams("split", vec=4, threads=64, slices=8, mode="twopass", grid="once")],
    "log_softmax": [cuda.CudaParams("cluster", vec=4, threads=256, slices=1), cuda.CudaParams("cluster", vec=4,
                    threads=128, slices=4, mode="twopass"),
                    # the first pass part by part, the output's refill closing a part's commit group at a time
                    cuda.CudaParams("cluster", vec=4, threads=128, slices=4, mode="twopass", buffers=1, chunks=4)],
    # one buffer (a whole 200 KB row per block), two buffers (100 KB halves on clusters of 2), clusters of 8
    "softmax_long_rows": [cuda.CudaParams("cluster", vec=4, threads=512, slices=1, mode="twopass"),
                          cuda.CudaParams("cluster", vec=4, threads=256, slices=2, mode="online"),
                          cuda.CudaParams("cluster", vec=4, threads=1024, slices=8, mode="twopass"),
                          cuda.CudaParams("cluster", vec=4, threads=256, slices=8, mode="online", buffers=1, chunks=8),
                          # the scalar kernels on both shapes: rows of 50000 and 50001 starting anywhere mod 16
                          # bytes (the cluster's: the middle of each slice 4 wide, head and tail one at a time)
                          cuda.CudaParams("cluster", vec=1, threads=256, slices=4, mode="twopass", buffers=1),
                          cuda.CudaParams("grid", vec=1, threads=128, slices=8, mode="online", buffers=1),
                          # 300 rows on groups of 64 blocks of 1024 threads: a few groups, each walking ~75 rows
                          # through its counters; the second shape set's odd rows take the scalar kernel
                          cuda.CudaParams("grid", vec=4, threads=1024, slices=64, mode="online"),
                          cuda.CudaParams("grid", vec=4, threads=256, slices=16, mode="twopass", buffers=1),
                          # the first pass part by part as the slice lands (a row's tail inside the last part)
                          cuda.CudaParams("grid", vec=4, threads=256, slices=16, mode="online", buffers=1, chunks=8)],
    "groupnorm": [cuda.CudaParams("rows", vec=1, threads=256, group=0, mode="online"),
                  cuda.CudaParams("split", vec=4, threads=128, slices=4, mode="twopass")],
    # a weight and bias value per vector (the second shape's odd channels: the scalar kernels), every layout
    "groupnorm_runs": [cuda.CudaParams("rows", vec=4, threads=256, group=0, mode="twopass"),
                       cuda.CudaParams("rows", vec=4, threads=128, group=32, mode="online"),
                       cuda.CudaParams("split", vec=4, threads=256, slices=4, mode="twopass", unroll=4),
                       cuda.CudaParams("split", vec=2, threads=128, slices=8, mode="online"),
                       cuda.CudaParams("split", vec=4, threads=128, slices=4, mode="twopass", unroll=2, grid="once"),
                       cuda.CudaParams("cluster", vec=2, threads=128, slices=2, mode="twopass"),
                       cuda.CudaParams("grid", vec=4, threads=256, slices=4, mode="online"),
                       cuda.CudaParams("grid", vec=4, threads=128, slices=4, mode="twopass", buffers=1, chunks=4)],
    # targets repeating every M elements inside the row (rowper): V-wide at r % M, one at a time where M is odd
    "hinge_loss": [cuda.CudaParams("split", vec=4, threads=256, slices=64, unroll=2, interleave=True),
                   cuda.CudaParams("split", vec=4, threads=128, slices=16, mode="twopass"),
                   cuda.CudaParams("rows", vec=4, threads=256, group=0)],
    "hinge_rows": [cuda.CudaParams("rows", vec=4, threads=256, group=0, mode="online"),
                   cuda.CudaParams("rows", vec=2, threads=128, group=32, mode="twopass"),
                   cuda.CudaParams("split", vec=4, threads=64, slices=8, unroll=4),
                   cuda.CudaParams("cluster", vec=4, threads=128, slices=2, buffers=1),  # (read one at a time)
                   cuda.CudaParams("columns", vec=1, threads=256, col_width=32, slices=8)],
    # a middle dim with an odd inner size: vectors at a stride of V rows, partials merged by a second kernel (the
    # first shapes); the second shapes' rows are not whole periods of V rows (the scalar columns fall-back)
    "argmax_middle": [cuda.CudaParams("strided", vec=4, threads=256, slices=4, unroll=8),
                      cuda.CudaParams("strided", vec=2, threads=64, slices=3, unroll=2),
                      cuda.CudaParams("strided", vec=8, threads=32, slices=1, unroll=4)],
    "mean_middle": [cuda.CudaParams("strided", vec=4, threads=128, slices=8, unroll=4),
                    cuda.CudaParams("strided", vec=4, threads=256, slices=2, unroll=8, fast_math=True)],
    # two accumulators in one pass (a max beside a log-sum-exp) meeting in the grid's workspace
    "logsumexp_max": [cuda.CudaParams("grid", vec=4, threads=64, slices=2, mode="online"),
                      cuda.CudaParams("grid", vec=2, threads=32, slices=3, mode="online", buffers=1)],
    # after a GEMM: the weight and bias vary along the row, read V-wide from each row's start
    "gemm_groupnorm": [cuda.CudaParams("rows", vec=4, threads=64, group=32, mode="twopass"),
                       cuda.CudaParams("split", vec=4, threads=64, slices=2, mode="online", unroll=2),
                       cuda.CudaParams("grid", vec=2, threads=64, slices=2, mode="twopass")],
}


@pytest.mark.gpu
@pytest.mark.parametrize("problem", sorted(GPU_CASES))
def test_cuda_candidates_are_verified_by_the_harness_on_the_gpu(patterns, problem, tmp_path):
    prop = CatalogProposer()
    cands = [prop.candidate(ctx(problem, "cuda"), patterns[problem], p) for p in GPU_CASES[problem]]
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=tmp_path)
    with Evaluator(problem_from_file(CATALOG / f"{problem}.py"), backend="cuda", config=cfg) as ev:
        verdicts = ev.evaluate_many(cands)
    for c, v in zip(cands, verdicts, strict=True):
        if problem in FINITE_ONLY:  # right on every finite input; the module's NaN comes of inputs it discards
            assert v.accepted and all(t.passed for t in v.trials), (label_of(c), v.reasons)
            assert any(w.startswith("masked non-finite") for w in v.warnings), v.warnings
            continue
        assert v.accepted, (label_of(c), v.reasons)
