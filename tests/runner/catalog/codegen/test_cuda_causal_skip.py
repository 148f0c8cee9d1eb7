"""Causal mask skipping (runner/catalog/skipping.py) in the CUDA `regs` template, on the real-world suite's GPT-2
attention softmax as transformers wrote it (a sliced `bias` tril buffer, `where(mask, w, finfo.min)`): the limit is
proven (finfo.min counts as the identity of the row's max and log-sum-exp where every row keeps its first column),
and the kernels, run on the emulated GPU of tests/runner/cuda_emulation.py (threaded: shuffles real), match the
module with exact zeros above the diagonal; compiled to PTX, no 64-bit division in a loop."""

from __future__ import annotations

import importlib.util
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from runner.catalog import skipping
from runner.catalog.codegen import cuda
from runner.catalog.codegen.cuda.regs import short_row_params
from runner.catalog.ir import Const, Iota, Op
from runner.catalog.recognition import recognise
from runner.harness.procs.abi import KernelLibrary
from tests.runner import cuda_emulation
from tests.runner.catalog.captures import captured
from tests.runner.catalog.codegen.ptx import divisions_by_source

SUITE = Path(__file__).resolve().parents[4] / "bench/suites/realworld"
NAMES = ["fp32/gpt2_causal_softmax", "bf16/gpt2_causal_softmax", "bf16/llama_causal_softmax_fp32"]


@pytest.fixture(scope="module")
def programs():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REALWORLD_SUITE_SMALL", "1")
        graphs = captured([(SUITE / f"{n}.py").read_text() for n in NAMES], timeout_s=600)
        mods = {}
        for n in NAMES:
            spec = importlib.util.spec_from_file_location(n.replace("/", "_"), SUITE / f"{n}.py")
            mods[n] = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mods[n])
    return {n: (recognise(g).program, mods[n]) for n, g in zip(NAMES, graphs, strict=True)}


def test_a_finfo_min_causal_mask_is_proven_skippable(programs):
    for name, (p, _) in programs.items():
        assert p.limit == Op("add", (Iota(1), Const(1.0))) and p.beyond == 0.0, name
        # GPT-2's where(mask, w, min); Llama's w + mask, the mask built by full(min) and masked_fill_(tril, 0)
        assert p.kept is not None and p.kept[0].name == ("add" if "llama" in name else "where"), name
        assert "where" not in {e.name for e in _ops(skipping.inside(p, p.out))}, name


def test_an_added_mask_that_is_not_very_negative_proves_nothing(programs):
    p = programs["bf16/llama_causal_softmax_fp32"][0]
    w = next(e for e in _ops(p.out) if e.name == "where")
    for weak in (Op("where", (w.args[0], w.args[1], Const(-1e4))), Op("where", (w.args[0], Const(1.0), w.args[2]))):
        def sub(e, weak=weak):
            from runner.catalog.ir import rebuild

            return weak if e == w else rebuild(e, sub)

        assert skipping.find(replace(p, out=sub(p.out), limit=None, kept=None)) is None, weak


def _ops(e):
    from runner.catalog.ir import walk

    return [x for x in walk(e) if isinstance(x, Op)]


def test_a_mask_value_that_is_not_very_negative_proves_nothing(programs):
    p = programs["fp32/gpt2_causal_softmax"][0]
    w = p.kept[0]
    weak = Op("where", (w.args[0], w.args[1], Const(-1e4)))

    def sub(e):
        from runner.catalog.ir import rebuild

        return weak if e == w else rebuild(e, sub)

    q = replace(p, out=sub(p.out), limit=None, kept=None)
    assert skipping.find(q) is None


def _params(p) -> list[cuda.CudaParams]:
    return short_row_params(p)[:2] + [replace(short_row_params(p)[0], vec=1)]


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_skipping_regs_kernels_match_the_module_with_exact_zeros(programs, tmp_path):
    srcs, plan = {}, {}
    for name, (p, _) in programs.items():
        for k, q in enumerate(_params(p)):
            key = f"{name.replace('/', '_')}_{k}"
            srcs[key], plan[key] = cuda.render(p, q), name
    libs = cuda_emulation.build(srcs, tmp_path, threaded=tuple(srcs))
    for key, path in libs.items():
        p, mod = programs[plan[key]]
        torch.manual_seed(0)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("REALWORLD_SUITE_SMALL", "1")
            x = mod.get_inputs()[0]
        with torch.no_grad():
            want = mod.Model().eval()(x)
        out = torch.full_like(want, float("nan"))
        KernelLibrary(path)([x.contiguous()], [out], None)
        above = torch.triu(torch.ones(want.shape[-2:], dtype=torch.bool), diagonal=1).expand_as(want)
        assert torch.equal(out[above], torch.zeros_like(out[above])), key  # exactly 0, written without a read
        tol = dict(rtol=1e-5, atol=1e-6) if want.dtype == torch.float32 else dict(rtol=1.6e-2, atol=1e-3)
        torch.testing.assert_close(out, want, **tol, msg=lambda m, k=key: f"{k}: {m}")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_skipping_regs_kernels_have_no_64_bit_division_in_a_loop(programs, tmp_path):
    srcs = [cuda.render(p, q) for p, _ in programs.values() for q in _params(p)]
    assert all("r0 < lim" in s for s in srcs)  # a vector past the row's limit is neither read nor computed
    assert divisions_by_source(srcs, tmp_path) == {}
