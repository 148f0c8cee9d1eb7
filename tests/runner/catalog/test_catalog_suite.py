"""Regressions from checking the catalog against the bench suite's patterns (bench/suites/catalog.txt), each on a small
module written here: the spellings of norms, instance and batch norms, losses and reductions the catalog must
recognise, C++ candidates that must compute what torch does (all programs in one g++ build), and a proposer that never
spends a trial on code it already measured or on a template that cannot run on the captured shapes."""

from __future__ import annotations

import ctypes
import hashlib
import math
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F  # noqa: N812

from runner.catalog.capture import capture_model
from runner.catalog.codegen import cpu, cuda
from runner.catalog.ir import Input, Load, Op, Program, Red
from runner.catalog.recognition import recognise
from runner.contract import Timing, Verdict
from runner.harness.procs.abi import FbTensor, describe
from runner.proposers.catalog import CatalogProposer, code_key, fits, label_of, remember
from runner.search.types import Attempt, History, ProblemContext
from tests.runner.catalog.test_catalog import CSRC, one_translation_unit


class Fn(nn.Module):
    """forward(x) = fn(self, x), with parameters self.ps[k] and buffers as given."""

    def __init__(self, fn, *params: torch.Tensor, buffers: dict | None = None):
        super().__init__()
        self.fn = fn
        self.ps = nn.ParameterList([nn.Parameter(p) for p in params])
        for k, v in (buffers or {}).items():
            self.register_buffer(k, v)

    def forward(self, x):
        return self.fn(self, x)


class Fn2(Fn):
    def forward(self, x, y):
        return self.fn(self, x, y)


def _x(*shape, lo=-1.0, hi=1.0):
    g = torch.Generator().manual_seed(math.prod(shape))
    return torch.rand(shape, generator=g) * (hi - lo) + lo


class Wrap(nn.Module):
    """A module inside a Model, as KernelBench writes it (the capture sees it as one call)."""

    def __init__(self, inner: nn.Module):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return self.inner(x)


def _in_stats() -> nn.Module:
    m = nn.InstanceNorm1d(6, affine=True, track_running_stats=True)
    with torch.no_grad():
        m.running_mean.uniform_(-1, 1)
        m.running_var.uniform_(0.5, 2.0)
        m.weight.uniform_(0.5, 1.5)
        m.bias.uniform_(-1, 1)
    return Wrap(m)


def _targets(shape):  # a KL-div target with zeros (xlogy(0, 0) = 0) and negatives (xlogy(t, t) = NaN for t < 0)
    t = _x(*shape)
    t[0, :5] = 0.0
    return t


def _ties(fill: float) -> torch.Tensor:
    """Rows full of ties (5 levels), a row of `fill` only (every element ties at +-inf), a row with two NaNs."""
    t = torch.round(_x(4, 9) * 2) / 2
    t[1] = fill
    t[2, 3] = t[2, 6] = float("nan")
    return t


# name -> (module, inputs): every one must be recognised and its C++ candidate must match torch
CASES = {
    "argmax_ties": (Fn(lambda m, x: torch.argmax(x, dim=1)), [_ties(float("-inf"))]),
    "argmin_ties": (Fn(lambda m, x: torch.argmin(x, dim=-1)), [_ties(float("inf"))]),
    "linalg_norm_fro": (Fn(lambda m, x: x / torch.linalg.norm(x)), [_x(3, 5, 7)]),
    "linalg_norm_dims": (Fn(lambda m, x: x / torch.linalg.norm(x, dim=(1, 2), keepdim=True)), [_x(3, 5, 7)]),
    "linalg_norm_ord1": (Fn(lambda m, x: torch.linalg.norm(x, ord=1, dim=1)), [_x(3, 5, 7)]),
    "vector_norm_l2": (Fn(lambda m, x: x / torch.linalg.vector_norm(x, dim=1, keepdim=True)), [_x(3, 33)]),
    "vector_norm_inf": (Fn(lambda m, x: torch.linalg.vector_norm(x, ord=float("inf"), dim=-1)), [_x(3, 5, 7)]),
    "vector_norm_minf": (Fn(lambda m, x: torch.linalg.vector_norm(x, ord=float("-inf"), dim=-1)), [_x(3, 5, 7)]),
    "norm_p3": (Fn(lambda m, x: x / torch.norm(x, p=3, dim=1, keepdim=True)), [_x(3, 33)]),
    "normalize_l2": (Fn(lambda m, x: F.normalize(x, dim=1)), [_x(3, 5, 7)]),
    "normalize_l1_last": (Fn(lambda m, x: F.normalize(x, p=1.0, dim=-1)), [_x(3, 5, 7)]),
    "instance_norm_functional": (Fn(lambda m, x: F.instance_norm(x, weight=m.ps[0], bias=m.ps[1], eps=1e-3),
                                    _x(6), _x(6)), [_x(3, 6, 5, 7)]),
    "instance_norm_running_stats": (_in_stats(), [_x(3, 6, 11)]),
    "kl_div_none": (Fn2(lambda m, x, t: F.kl_div(x, t, reduction="none")), [_x(7, 33), _targets((7, 33))]),
    "hinge_broadcast": (Fn2(lambda m, p, t: torch.mean(torch.clamp(1 - p * t, min=0))),
                        [_x(37, 37), torch.randint(0, 2, (37,), generator=torch.Generator().manual_seed(1)) * 2.0 - 1]),
}


def _lower(model: nn.Module, inputs: list):
    return recognise(capture_model(model.eval(), inputs))


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    """Every case's pattern, and one C++ candidate of each recognised case, all compiled in one g++ run."""
    from runner.harness.build import toolchain

    pats = {name: _lower(m, xs) for name, (m, xs) in CASES.items()}
    ok = [name for name, pat in pats.items() if pat.program is not None]
    srcs = [cpu.render(pats[n].program, cpu.CpuParams("rows" if pats[n].program.is_row else "flat", "twopass", "one"))
            for n in ok]
    tmp = tmp_path_factory.mktemp("suite")
    (tmp / "all.cpp").write_text(one_translation_unit(srcs))
    tc = toolchain("cpu")
    flags = [f if f != "-O3" else "-O1" for f in tc.flags]
    proc = subprocess.run([tc.compiler, *flags, "-I", str(CSRC), "all.cpp", "-o", "all.so"], cwd=tmp,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return pats, ok, ctypes.CDLL(str(tmp / "all.so"))


@pytest.mark.parametrize("name", list(CASES))
def test_suite_spellings_are_recognised_and_their_cpu_kernel_matches_torch(built, name):
    pats, ok, lib = built
    assert pats[name].program is not None, pats[name].reason
    k = ok.index(name)
    model, xs = CASES[name]
    with torch.no_grad():
        ref = model.eval()(*xs)
    out = torch.empty_like(ref)
    args = [*xs, *model.state_dict().values()]
    fwd = getattr(lib, f"fusebot_forward_{k}")
    fwd.restype = ctypes.c_int
    ins = (FbTensor * len(args))(*[describe(t.contiguous()) for t in args])
    outs = (FbTensor * 1)(describe(out))
    assert fwd(ins, len(args), outs, 1, None) == 0
    torch.testing.assert_close(out, ref, atol=1e-5, rtol=1e-5, equal_nan=True)


def test_the_kl_div_case_has_zero_and_negative_targets():
    """torch.xlogy(t, t) is 0 where t == 0 and NaN where t < 0 (the kernel used to give 0 for a negative t)."""
    model, xs = CASES["kl_div_none"]
    ref = model(*xs)
    assert ref.isnan().any() and (ref[0, :5] == 0).all()


@pytest.mark.parametrize("fn, why", [
    (lambda m, x: F.batch_norm(x, m.rm, m.rv, training=True), "training mode"),
    (lambda m, x: torch.linalg.norm(x, ord=2), "matrix norm"),
    (lambda m, x: torch.norm(x, p=0), "p=0"),
])
def test_what_the_catalog_cannot_compute_says_why(fn, why):
    m = Fn(fn, buffers={"rm": torch.zeros(6), "rv": torch.ones(6)})
    pat = _lower(m, [_x(6, 6)])
    assert pat.family == "unsupported" and why in pat.reason, pat.reason


def test_batch_norm_without_running_stats_is_unsupported_in_eval_mode_too():
    pat = _lower(Wrap(nn.BatchNorm2d(6, track_running_stats=False)), [_x(3, 6, 5, 7)])
    assert pat.family == "unsupported" and "batch statistics" in pat.reason


def test_kernelbench_batch_norm_is_lowered_as_the_harness_runs_it():
    """The harness builds the reference in eval mode (runner.harness.problem.build_model): running statistics, elementwise."""
    pat = _lower(Wrap(nn.BatchNorm2d(6)), [_x(3, 6, 5, 7)])
    assert pat.family == "elementwise" and any("running statistics" in n for n in pat.notes)
    assert {i.abi for i in pat.program.inputs} == {0, 1, 2, 3, 4}  # x, weight, bias, running mean and var


def test_a_cuda_argmax_stores_its_index_without_rounding_it_through_a_float():
    """fb_to<long long>(float) rounded every index above 2^24 (an argmax over a whole 4096 x 393216 tensor): the index
    is a long long and goes through the long long overload (compiled for every layout by the nvcc sweep)."""
    import re

    pat = _lower(Fn(lambda m, x: torch.argmax(x)), [_x(4, 4096)])
    src = cuda.render(pat.program, cuda.CudaParams("split", vec=4, threads=256, slices=8))
    assert "template <typename T> __device__ __forceinline__ T fb_to(long long v)" in src
    (name,) = re.findall(r"const long long (rv\d+) = acc\d+\.i;", src)[:1]
    assert f"fb_to<long long>({name})" in src


# ---- the proposer ------------------------------------------------------------------------------------------------

SUM_MID = '''import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        return torch.sum(x, dim=1)

def get_inputs():
    return [torch.rand(8, 37, 45)]

def get_init_inputs():
    return []
'''


def _accepted(c, ms: float) -> Attempt:
    t = Timing(median_ms=ms, iqr_ms=0.0, mean_ms=ms, min_ms=ms, n=5, samples_ms=[ms] * 5, clock="monotonic",
               l2_flushed=False)
    return Attempt(round=1, proposer="catalog", idea="", candidate=c,
                   verdict=Verdict(candidate_id=c.id, problem="sum", accepted=True, timing=t))


def test_the_proposer_never_proposes_code_it_already_tried():
    """A plain sum over a middle dim: the columns layout ignores the vector width and the online/two-pass switch, so
    the refinements of the best kernel used to be the same code under another label (a GPU trial each)."""
    m = Fn(lambda m, x: torch.sum(x, dim=1))
    remember(SUM_MID, _lower(m, [torch.rand(8, 37, 45)]))
    c = ProblemContext(name="sum_mid", reference_source=SUM_MID, backend="cuda")
    prop, h, seen = CatalogProposer(), History(), []
    for _ in range(30):
        new = [x for i in prop.ideas(c, h, 4) for x in prop.implement(c, i, h, 2)]
        if not new:
            break
        for x in new:
            h.attempts.append(_accepted(x, 1.0 + int(hashlib.sha256(x.id.encode()).hexdigest()[:6], 16) / 2**24))
        seen += new
    keys = [code_key(x) for x in seen]
    assert len(seen) >= 8 and len(set(keys)) == len(keys), sorted(label_of(x) for x in seen)
    twins = cuda.CudaParams("columns", vec=2, threads=256, col_width=32, slices=8, mode="twopass")
    assert twins.label() not in {label_of(x) for x in seen}  # the same code as vec=1, online


CONV = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 5, 3)
        self.bias = nn.Parameter(torch.randn(5, 1, 1))

    def forward(self, x):
        return torch.relu(self.conv(x)) + self.bias


def get_inputs():
    return [torch.rand(2, 3, 9, 11)]


def get_init_inputs():
    return []
'''


def test_the_shared_c_blocks_read_the_same_inside_a_python_string():
    """code_key finds the shared blocks inside a KernelBench candidate (a Python file holding the CUDA source as a
    string) by their repr(): a quote or a backslash in them (an apostrophe in a C comment) changes the
    quoting or escaping, the blocks are no longer found, and a needless fast-math twin takes a trial of its own."""
    from runner.catalog.codegen.head import MATH
    from runner.catalog.codegen.used import ACCUMULATORS

    for name, block in (("MATH", MATH), ("ACCUMULATORS", ACCUMULATORS), ("cuda.FAST", cuda.FAST),
                        ("cpu.FAST", cpu.FAST)):
        bad = sorted({c for c in block if c in "'\"\\"})
        assert not bad, f"{name} holds {bad}: reword it (see code_key in runner/proposers/catalog.py)"


def test_fast_math_where_nothing_uses_it_is_the_same_code():
    """Fast math changes exp, log and division only: for a ReLU, a batch norm's affine or a conv's ReLU + bias
    epilogue, the fast variant is the same machine code and must not take a trial of its own."""
    from runner.contract import Candidate

    def key(prog, params):
        src = (cuda if isinstance(params, cuda.CudaParams) else cpu).render(prog, params)
        backend = "cuda" if isinstance(params, cuda.CudaParams) else "cpu"
        return code_key(Candidate(id=params.label(), format="fast", backend=backend, sources={"k": src}))

    relu = Program(inputs=[Input(0, (64, 256), "float32")], out=Op("relu", (Load(0),)), shape=(64, 256),
                   out_shape=(64, 256))
    softmax = Program(inputs=[Input(0, (64, 256), "float32")], out=Op("exp", (Op("sub", (Load(0), Red("lse", Load(0)))),)),
                      shape=(64, 256), axes=(1,), out_shape=(64, 256))
    for p in (cuda.CudaParams("flat", vec=4, threads=256), cpu.CpuParams("flat", threads="one")):
        assert key(relu, p) == key(relu, replace(p, fast_math=True))
    rows = cuda.CudaParams("rows", vec=4, threads=256, group=32)
    assert key(softmax, rows) != key(softmax, replace(rows, fast_math=True))
    ns: dict = {}
    exec(compile(CONV, "conv.py", "exec"), ns)  # noqa: S102 - the test's own module
    remember(CONV, _lower(ns["Model"](), ns["get_inputs"]()))
    c = ProblemContext(name="conv", reference_source=CONV, backend="cuda")
    prop = CatalogProposer()
    flat = cuda.CudaParams("flat", vec=4, threads=256)
    assert prop.pattern(c).family == "epilogue"
    assert code_key(prop.candidate(c, prop.pattern(c), flat)) == \
        code_key(prop.candidate(c, prop.pattern(c), replace(flat, fast_math=True)))


def test_an_odd_row_length_proposes_the_scalar_kernels_it_would_run():
    """Rows of 65535 (level1 38/39): the vector path needs a row length divisible by the width, so every float4
    candidate ran its scalar kernel: the proposer names them as what they are (vec=1), and proposes each once."""
    from runner.catalog.pattern import Pattern
    from runner.proposers.catalog import effective

    prog = Program(inputs=[Input(0, (64, 65535), "float32")], out=Op("div", (Load(0), Red("sum", Op("abs", (Load(0),))))),
                   shape=(64, 65535), axes=(1,), out_shape=(64, 65535))
    assert effective(cuda.CudaParams("rows", vec=4, threads=256), prog).vec == 1
    assert effective(cuda.CudaParams("columns", vec=4, threads=256), prog).vec == 1  # columns: 4 across an inner dim
    middle = Program(inputs=[Input(0, (8, 64, 4095), "float32")], out=Red("sum", Load(0)), shape=(8, 64, 4095),
                     axes=(1,), out_shape=(8, 1, 4095))
    assert effective(cuda.CudaParams("columns", vec=2, threads=256), middle).vec == 1
    assert effective(cuda.CudaParams("columns", vec=4, threads=256), replace(
        middle, inputs=[Input(0, (8, 64, 4096), "float32")], shape=(8, 64, 4096), out_shape=(8, 1, 4096))).vec == 4
    even = replace(prog, inputs=[Input(0, (64, 65536), "float32")], shape=(64, 65536), out_shape=(64, 65536))
    assert effective(cuda.CudaParams("split", vec=4, threads=256), even).vec == 4
    src = "# a row of 65535\n"
    remember(src, Pattern("row", program=prog))
    c = ProblemContext(name="odd", reference_source=src, backend="cuda")
    params = [p for s in CatalogProposer().strategies(c) for p in s.params]
    assert params and all(p.vec == 1 for p in params if p.layout != "flat")
    labels = [p.label() for s in CatalogProposer().strategies(c) for p in s.params]
    assert len(labels) == len(set(labels))


def _norm_rows(rows: int, per_row: tuple[int, int]) -> Program:
    """A GroupNorm-like program: `rows` rows of per_row[0] channels of per_row[1] values, a weight per channel."""
    shape = (rows, *per_row)
    x, w = Load(0), Load(1)
    out = Op("mul", (Op("sub", (x, Red("mean", x))), w))
    return Program(inputs=[Input(0, shape, "float32"), Input(1, (per_row[0], 1), "float32")], out=out, shape=shape,
                   axes=(1, 2), out_shape=shape)


def test_rows_held_by_a_cluster_try_the_first_pass_in_parts_first():
    """Rows of 1-1.5 MB (softmax 4096 x 393216, InstanceNorm): the cluster's two-pass sets with the slice's fill in
    4 parts lead, where they run as named (whole vectors, the row's own output); every set renders. Rows of 65535
    (not whole vectors) and a per-row output (a logsumexp) get none: their kernels cannot cut the fill."""
    from runner.catalog.space import strategies

    def cluster(prog):
        return next(s for s in strategies(prog, "cuda") if s.key == "cuda-rows-cluster").params

    x = Load(0)
    soft = Program(inputs=[Input(0, (4096, 393216), "float32")], out=Op("exp", (Op("sub", (x, Red("lse", x))),)),
                   shape=(4096, 393216), axes=(1,), out_shape=(4096, 393216))  # softmax as the capture lowers it
    lead = cluster(soft)[:3]
    assert [(p.chunks, p.mode, p.buffers, p.slices, p.vec) for p in lead] == \
        [(4, "twopass", 1, 16, 2), (4, "twopass", 1, 16, 4), (4, "twopass", 1, 8, 4)]
    assert [p for p in cluster(soft) if p.chunks == 1]  # the whole-slice sets follow
    from runner.proposers.catalog import effective

    assert all(effective(p, soft) == p for p in lead)
    for p in lead:
        cuda.render(soft, p)  # NotExpressible would fail here
    big = replace(soft, inputs=[Input(0, (64, 600000), "float32")], shape=(64, 600000), out_shape=(64, 600000))
    labels = [p.label() for p in cluster(big)]  # 2.4 MB rows: clusters of 16 alone, each set once
    assert len(labels) == len(set(labels)) and sum(p.chunks == 4 for p in cluster(big)) == 2
    odd = replace(soft, inputs=[Input(0, (64, 65535), "float32")], shape=(64, 65535), out_shape=(64, 65535))
    assert all(p.chunks == 1 for p in cluster(odd))
    lse = replace(soft, out=Red("lse", x), out_shape=(4096, 1))
    assert all(p.chunks == 1 for p in cluster(lse))


def test_rows_beyond_a_cluster_that_fit_on_chip_a_few_at_a_time_go_to_a_grid_group_first():
    """GroupNorm's 896 rows of 8 MB: three rows on chip at once, a group of 88 blocks (two per SM, 95 KB each) or 44
    (one per SM) per row, proposed first; LayerNorm's 16 MB rows fit once at most: no grid, as before."""
    from runner.catalog.space import strategies

    big = strategies(_norm_rows(896, (8, 262144)), "cuda")
    assert big[0].key == "cuda-rows-grid"
    assert {(p.slices, p.threads) for p in big[0].params} == {(88, 256), (88, 128), (44, 256)}
    assert all(fits(p, _norm_rows(896, (8, 262144))) for p in big[0].params)
    assert all(s.key != "cuda-rows-grid" for s in strategies(_norm_rows(16, (16, 262144)), "cuda"))
    # a channel of 63 values: the 2-wide kernel would run its scalar fall-back, so it is proposed as what it runs
    from runner.proposers.catalog import effective

    # whole vectors with the first pass in 4 parts first, one pass (Welford) before two
    first = big[0].params[0]
    assert (first.vec, first.chunks, first.mode, first.buffers) == (4, 4, "online", 1)
    assert effective(first, _norm_rows(896, (8, 262144))) == first
    assert [p for p in big[0].params if p.chunks == 1 and p.vec == 2]  # the half-width whole-slice sets after them
    # a channel of 63 values: the vector kernel would run its scalar fall-back (whose fill is not cut in parts), so
    # it is proposed as what it runs
    assert effective(first, _norm_rows(896, (8, 63))) == replace(first, vec=1, chunks=1)


def test_a_cluster_slice_beyond_shared_memory_is_not_proposed():
    row = Program(inputs=[Input(0, (4, 393216), "float32")], out=Op("exp", (Op("sub", (Load(0), Red("lse", Load(0)))),)),
                  shape=(4, 393216), axes=(1,), out_shape=(4, 393216))
    assert fits(cuda.CudaParams("cluster", vec=4, threads=512, slices=16), row)  # 96 KiB a block
    assert fits(cuda.CudaParams("cluster", vec=4, threads=512, slices=8), row)  # 192 KiB
    assert not fits(cuda.CudaParams("cluster", vec=4, threads=512, slices=4), row)  # 384 KiB: a launch error
    assert fits(cuda.CudaParams("rows", vec=4, threads=512), row)


# ---- the harness ---------------------------------------------------------------------------------------------------

MSE = '''import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, predictions, targets):
        return torch.mean((predictions - targets) ** 2)


def get_inputs():
    return [torch.rand(37, 45), torch.rand(37, 45)]


def get_init_inputs():
    return []
'''


def _degenerate(tmp_path, source: str) -> str | None:
    """The harness's verdict on a problem's degeneracy from three of the judge's trials (its prepare step, run here)."""
    from runner.contract import ProblemSpec
    from runner.harness.checks import degenerate_reason
    from runner.harness.evaluator import Evaluator
    from runner.harness.problem import load
    from runner.harness.procs import judge

    (tmp_path / "p.py").write_text(source)
    spec = ProblemSpec(name="p", path=str(tmp_path / "p.py"))
    st = judge.State()
    st.problem = load(spec)
    st.model = st.problem.model_cls(*st.problem.init_args)
    st.refs = {}
    preps = [judge.prepare(st, {"seed": 11 * k, "shape_set": 0, "randn": [1.0, 0.5] if k % 2 else None, "trial": k})
             for k in range(1, 4)]
    with Evaluator(spec, backend="cpu") as ev:
        ev.reference.digests = [(r["digest"], r["near_constant"], r.get("value_span"), r["atol_min"]) for r in preps]
        return degenerate_reason(ev.reference.digests)


def test_a_scalar_loss_is_not_called_degenerate(tmp_path):
    """A loss is one number: no spread within the output, yet each input gives another value. The judge called every
    scalar output near-constant, so the suite's losses (MSE, Huber, KL, hinge) could never report a speedup."""
    assert _degenerate(tmp_path, MSE) is None
    constant = MSE.replace("torch.mean((predictions - targets) ** 2)", "1.0 + 1e-6 * torch.mean(predictions)")
    assert "every value within atol" in (_degenerate(tmp_path, constant) or "")


def test_a_confirmed_loss_is_not_called_degenerate(harness_cache):
    """The final confirmation re-verifies in a fresh process. On one trial a scalar loss is one number, which cannot
    be told from a constant: every loss of the H100 bench was called degenerate there. It takes two draws now."""
    from runner.harness.evaluator import Evaluator, HarnessConfig
    from runner.pipeline import problem_from_file
    from runner.proposers.catalog import CatalogProposer
    from runner.search.types import ProblemContext
    from tests.runner.conftest import FAST_TIMER

    path = Path(__file__).resolve().parents[2] / "fixtures/problems/catalog/mse_loss.py"
    ctx = ProblemContext(name="mse_loss", reference_source=path.read_text(), backend="cpu")
    prop = CatalogProposer()
    params = next(p for s in prop.strategies(ctx) for p in s.params if p.threads == "one")
    cand = prop.candidate(ctx, prop.pattern(ctx), params)
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=harness_cache)
    with Evaluator(problem_from_file(path), backend="cpu", config=cfg) as ev:
        v = ev.confirm(cand, rounds=1)
    assert v.accepted, v.reasons
    assert len(v.trials) == 2 and not v.degenerate, v.warnings


def test_refining_a_grid_steps_its_parts_only_where_a_part_can_be_waited_for():
    """The refinement around a grid parameter set steps `chunks` (1, 2, 4, 8) with one buffer and whole vectors, and
    proposes no cut fill anywhere else (two buffers, the scalar kernel): those would not render."""
    from runner.proposers.catalog import _neighbours

    base = cuda.CudaParams("grid", vec=4, threads=256, slices=88, mode="online", buffers=1, chunks=4)
    near = _neighbours(base)
    assert {p.chunks for p in near if replace(p, chunks=4) == base} == {2, 8}
    assert all(p.chunks == 1 or (p.buffers == 1 and p.vec > 1) for p in near)
    assert any(p.vec == 2 and p.chunks == 4 for p in near)  # the other steps keep the parts where they still can
    assert all(p.chunks == 1 for p in _neighbours(replace(base, buffers=2, chunks=1)))
    row = _norm_rows(896, (8, 262144))
    for p in near:
        cuda.render(row, p)  # every neighbour renders
    on_chip = _neighbours(replace(base, layout="cluster", slices=16))  # clusters too
    assert {p.chunks for p in on_chip if p.layout == "cluster" and p.slices == 16 and p.vec == 4} >= {2, 4, 8}
