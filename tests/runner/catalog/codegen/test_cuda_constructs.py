"""The CUDA layouts on the IR's newer constructs, end to end from the modules in tests/fixtures/problems/catalog_aten:
bf16 loads and stores with fp32 accumulation and rounding where the reference rounds (LlamaRMSNorm, a softmax in
fp32 cast to bf16), `where` with a causal mask from index arithmetic (Iota), several outputs (a residual sum and its
norm), strided views read in place (RoPE's rotate_half), gathers (cross-entropy's target logit) and reductions over
every row (a mean of per-row losses).

On the CPU each problem is captured and recognised, rendered in every layout the emulator runs exactly (flat, bcast,
rows, regs, columns, split; tests/runner/cuda_emulation.py, threaded where blocks merge) and compared with the
module's own forward, then judged on inputs holding NaN and both infinities by the judge's own rule
(tests/runner/nonfinite.py); every parameter set the catalog proposes for them compiles with nvcc."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch

from runner.catalog.codegen import cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.codegen.cuda.regs import short_row_params
from runner.catalog.recognition import recognise
from runner.catalog.space import strategies
from runner.harness.procs.abi import KernelLibrary
from tests.runner import cuda_emulation
from tests.runner.catalog.captures import captured
from tests.runner.catalog.codegen.nvcc import compile_together
from tests.runner.nonfinite import judged, nonfinite_inputs

ATEN = Path(__file__).resolve().parents[3] / "fixtures/problems/catalog_aten"
DT = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "int64": torch.int64}
EMULATED = {  # layout -> parameter sets the emulator runs exactly (the row layouts threaded)
    "flat": [cuda.CudaParams("flat", vec=4, threads=64, grid="stride", unroll=2),
             cuda.CudaParams("flat", vec=1, threads=32, grid="once")],
    "bcast": [cuda.CudaParams("bcast", vec=4, threads=64, grid="stride", unroll=2)],
    "rows": [cuda.CudaParams("rows", vec=4, threads=64, group=32, mode="online"),
             cuda.CudaParams("rows", vec=2, threads=64, group=0, mode="twopass")],
    "columns": [cuda.CudaParams("columns", vec=1, threads=64, col_width=32, slices=2)],
    "split": [cuda.CudaParams("split", vec=4, threads=32, slices=3, mode="twopass")],
}
THREADED = ("rows", "regs", "columns", "split")


# the problems whose programs the constructs above are
PROBLEMS = ("causal_softmax", "llama_rmsnorm_bf16", "prenorm_residual", "rope_rotate_half", "softmax_fp32_cast_bf16",
            "cross_entropy", "lm_loss_padded", "weighted_mse", "masked_mean_pooling")


@pytest.fixture(scope="module")
def aten():
    names = list(PROBLEMS)
    sources = {n: (ATEN / f"{n}.py").read_text() for n in names}
    pats = dict(zip(names, (recognise(g) for g in captured(list(sources.values()))), strict=True))
    assert all(pats[n].program is not None for n in names), {n: pats[n].reason for n in names}
    return {n: (sources[n], pats[n]) for n in names}


def _module(source: str) -> dict:
    scope: dict = {}
    exec(compile(source, "<problem>", "exec"), scope)  # a fixture of this repository
    return scope


def _params_for(prog) -> list[cuda.CudaParams]:
    out = [p for layout in ("flat", "bcast", "rows", "columns", "split") for p in EMULATED[layout]]
    return out + short_row_params(prog)[:2]


def _rendered(aten, masked_online: bool = False) -> dict[str, tuple[str, cuda.CudaParams, str]]:
    """name -> (problem, params, source) for every emulated layout that expresses the problem; the causal softmax's
    online sets only (`masked_online`), or every set but those."""
    out = {}
    for n, (_, pat) in aten.items():
        for k, params in enumerate(_params_for(pat.program)):
            if masked_online != (n == "causal_softmax" and params.mode == "online"):
                continue
            if params.layout == "split" and pat.program.split()[2] != 1:  # (its host refuses a middle dim)
                continue
            try:
                out[f"{n}-{k}"] = (n, params, cuda.render(pat.program, params))
            except NotExpressible:
                continue
    return out


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_new_constructs_match_the_module_on_an_emulated_gpu(aten, tmp_path):
    assert {"prenorm_residual", "rope_rotate_half", "llama_rmsnorm_bf16", "causal_softmax"} <= set(aten)
    rendered = _rendered(aten)
    layouts = {(n, params.layout) for n, params, _ in rendered.values()}
    assert {("prenorm_residual", "rows"), ("prenorm_residual", "regs"), ("rope_rotate_half", "flat"),
            ("causal_softmax", "split"), ("llama_rmsnorm_bf16", "regs"), ("cross_entropy", "rows"),
            ("cross_entropy", "regs"), ("weighted_mse", "regs"), ("lm_loss_padded", "rows")} <= layouts, layouts
    _match(aten, rendered, tmp_path)


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_an_online_log_sum_exp_over_masked_elements(aten, tmp_path):
    _match(aten, _rendered(aten, masked_online=True), tmp_path)


def _match(aten, rendered: dict, tmp_path: Path) -> None:
    """Each rendered source, built for the emulator, against the module's own forward on its inputs."""
    libs = cuda_emulation.build({k: src for k, (_, _, src) in rendered.items()}, tmp_path,
                                threaded=tuple(k for k, (_, p, _) in rendered.items() if p.layout in THREADED))
    for key, (n, params, _) in rendered.items():
        source, pat = aten[n]
        scope = _module(source)
        torch.manual_seed(0)
        model = scope["Model"](*scope["get_init_inputs"]())
        xs = scope["get_inputs"]()
        with torch.no_grad():
            want = model(*xs)
        want = list(want) if isinstance(want, (tuple, list)) else [want]
        ins = [x.contiguous() for x in xs] + [t.contiguous() for t in model.state_dict().values()]
        outs = [torch.empty(o.shape, dtype=DT[o.dtype]) for o in pat.program.outputs]
        KernelLibrary(libs[key])(ins, outs, None)
        for got, ref in zip(outs, want, strict=True):
            tol = dict(rtol=1e-5, atol=1e-5) if ref.dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-2)
            torch.testing.assert_close(got.view(ref.shape), ref, **tol, msg=lambda m, k=key, p=params: f"{k} "
                                       f"{p.label()}: {m}")
        # the judge's non-finite trial: NaN and both infinities in every floating input
        bad = nonfinite_inputs(xs, seed=1)
        outs = [torch.empty(o.shape, dtype=DT[o.dtype]) for o in pat.program.outputs]
        KernelLibrary(libs[key])(bad + ins[len(xs):], outs, None)
        assert judged(model, bad, outs) == [], (key, params.label())


def test_a_strided_view_is_never_read_as_a_broadcast(aten):
    """rotate_half's halves are strided views of q: the bcast layout (indices stepped as broadcasts) refuses them,
    the flat kernels read them through their own strides."""
    prog = aten["rope_rotate_half"][1].program
    assert cuda.broadcast_view(prog) is None
    with pytest.raises(NotExpressible):
        cuda.render(prog, cuda.CudaParams("bcast", vec=4, threads=128))
    src = cuda.render(prog, cuda.CudaParams("flat", vec=4, threads=128))
    assert "fb_sidx(a, 3, flat)" in src and "fb_sidx(a, 4, flat)" in src


def test_several_outputs_are_stored_by_every_layout(aten):
    """A residual sum beside its norm: each layout's kernels store output 1 where they store output 0, V-wide in the
    vector kernels, and the V-wide path checks its alignment."""
    prog = aten["prenorm_residual"][1].program
    for params in (cuda.CudaParams("rows", vec=4, threads=128, group=32), short_row_params(prog)[0],
                   cuda.CudaParams("split", vec=4, threads=128, slices=4),
                   cuda.CudaParams("cluster", vec=4, threads=128, slices=2),
                   cuda.CudaParams("grid", vec=4, threads=128, slices=2),
                   cuda.CudaParams("columns", vec=4, threads=128, col_width=32, slices=4)):
        src = cuda.render(prog, params)
        assert "a.more[0]" in src, params.label()
        if params.layout != "columns":  # (columns: I = 1 here, its vectors run across columns: the scalar kernel)
            assert f"fb_stv<float, {params.vec}>((float*)a.more[0]" in src, params.label()
            assert f"fb_aligned(a.more[0], {params.vec} * (int)sizeof(float))" in src, params.label()


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_every_proposed_set_of_the_new_constructs_compiles(tmp_path):
    """Every layout the catalog proposes for every problem of catalog_aten it recognises (one parameter set per code
    shape), and the short-row sets, compile with nvcc for sm_90 in one run."""
    names = sorted(p.stem for p in ATEN.glob("*.py"))
    pats = [recognise(g) for g in captured([(ATEN / f"{n}.py").read_text() for n in names])]
    sources, seen, rendered = [], set(), set()
    for name, pat in zip(names, pats, strict=True):
        prog = pat.program
        if prog is None:
            continue
        for p in [q for s in strategies(prog, "cuda") for q in s.params] + short_row_params(prog):
            shape = (id(prog), p.layout, p.vec == 1, p.mode, p.group == 32, p.chunks > 1, p.grid)
            if shape not in seen and isinstance(p, cuda.CudaParams):
                seen.add(shape)
                try:
                    sources.append(cuda.render(prog, p, abi_offset=1 if pat.family == "epilogue" else 0))
                except NotExpressible:  # (a reduction over every row outside rows and regs)
                    assert prog.has_totals and p.layout not in ("rows", "regs"), p.label()
                    continue
                rendered.add(name)
    assert set(PROBLEMS) <= rendered and len(sources) > 20
    rc, log = compile_together(sources, tmp_path)
    assert rc == 0, log[:3000]
