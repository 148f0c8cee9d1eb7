"""The `rope` template (runner/catalog/codegen/cuda/rope.py) on the real-world suite's rotary embeddings at CI sizes:
recognised from the captured graph (runner/catalog/rope.py), proposed first, its kernels run on the emulated GPU of
tests/runner/cuda_emulation.py against the module's own forward (each thread's work is its own: the sequential
emulation is exact), and compiled to PTX: vector loads of x, cos and sin, no 64-bit division or remainder."""

from __future__ import annotations

import importlib.util
import re
import shutil
from pathlib import Path

import pytest
import torch

from runner.catalog import rope
from runner.catalog.codegen import cuda
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.ir import Input, Load, Op, Program
from runner.catalog.recognition import recognise
from runner.catalog.space import strategies
from runner.harness.procs.abi import KernelLibrary
from runner.proposers.catalog import CatalogProposer
from runner.search.types import ProblemContext
from tests.runner import cuda_emulation
from tests.runner.catalog.captures import captured
from tests.runner.catalog.codegen.ptx import compile_ptx, divisions_by_source, unit_of

SUITE = Path(__file__).resolve().parents[4] / "bench/suites/realworld"
# problem -> (style, rotated features, head dim, outputs per program) at CI sizes
ROPES = {"llama_rope": ("half", 16, 16, 1), "neox_partial_rope": ("half", 8, 32, 2),
         "gptj_interleaved_rope": ("pairs", 16, 32, 2)}
NAMES = [f"{d}/{n}" for d in ("fp32", "bf16") for n in ROPES]


def _module(name: str):
    spec = importlib.util.spec_from_file_location(name.replace("/", "_"), SUITE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture(scope="module")
def programs():
    """Problem -> its programs (one per fused stage: Llama's q and k have different head counts) and the module."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("REALWORLD_SUITE_SMALL", "1")
        graphs = captured([(SUITE / f"{n}.py").read_text() for n in NAMES], timeout_s=600)
        mods = {n: _module(n) for n in NAMES}
    out = {}
    for name, g in zip(NAMES, graphs, strict=True):
        pat = recognise(g)
        progs = [st.pattern.program for st in pat.plan.stages if st.kind == "fused"] if pat.plan else [pat.program]
        out[name] = (progs, mods[name], pat)
    return out


def test_every_rotary_embedding_of_the_suite_is_recognised_from_its_graph(programs):
    for name, (progs, _, pat) in programs.items():
        style, rot, head, n_out = ROPES[name.split("/")[1]]
        for p in progs:
            assert p.rope is not None, name
            assert (p.rope.style, p.rope.rot, p.rope.head, len(p.rope.xs)) == (style, rot, head, n_out), name
            first = strategies(p, "cuda")[0]
            assert first.key == "cuda-rope" and first.params[0].layout == "rope", name
        if pat.family == "graph":  # q and k of different head counts: one program each, and one rope for both
            whole = pat.program.rope
            assert whole is not None and len(whole.xs) == 2 and not whole.one_shape, name
            assert strategies(pat.program, "cuda")[0].key == "cuda-rope"


def test_q_and_k_of_different_head_counts_are_one_fast_candidate(programs):
    """Llama's graph (32 query and 8 key-value heads: two programs for the general templates) gets a single kernel
    from its rope parameter sets, and a program per stage from the others."""
    prop = CatalogProposer()
    for name in ("fp32/llama_rope", "bf16/llama_rope"):
        pat = programs[name][2]
        ctx = ProblemContext(name="llama_rope", reference_source=(SUITE / f"{name}.py").read_text(), backend="cuda")
        one = prop.candidate(ctx, pat, strategies(pat.program, "cuda")[0].params[0])
        assert one.format == "fast" and list(one.sources) == ["kernel.cu"]
        assert one.sources["kernel.cu"].count("fb_stv<") >= 4  # both outputs' stores in one kernel
        general = next(st for st in strategies(pat.program, "cuda") if not st.key.startswith("cuda-rope"))
        other = prop.candidate(ctx, pat, general.params[0])
        assert other.format == "kernelbench"


def test_a_graph_without_a_rotary_embedding_has_none_and_the_template_refuses_it():
    g = captured([(SUITE / "fp32/gpt2_new_gelu.py").read_text()], timeout_s=600)[0]
    assert rope.find(g) is None
    p = Program(inputs=[Input(0, (8, 16), "float32")], out=Op("neg", (Load(0),)), shape=(8, 16), axes=(),
                out_dtype="float32", out_shape=(8, 16))
    assert "cuda-rope" not in [s.key for s in strategies(p, "cuda")]
    with pytest.raises(NotExpressible):
        cuda.render(p, cuda.CudaParams("rope", vec=4, threads=256))


def _params(p) -> list[cuda.CudaParams]:
    """The widest width and the narrow fall-back's, on 64-thread blocks (several blocks on the emulated GPU), and
    every heads-per-thread set the catalog proposes."""
    vs = [v for v in (8, 4, 2, 1) if v in {q.vec for q in strategies(p, "cuda")[0].params}]
    heads = [q for st in strategies(p, "cuda") if st.key == "cuda-rope-heads" for q in st.params if q.threads == 128]
    return [cuda.CudaParams("rope", vec=v, threads=64) for v in (vs[0], vs[-1])] + heads


def test_heads_per_thread_must_divide_every_outputs_head_count(programs):
    llama = programs["fp32/llama_rope"][2].program  # 4 query heads, 2 key-value heads at CI sizes
    assert [q.unroll for st in strategies(llama, "cuda") if st.key == "cuda-rope-heads" for q in st.params] == [2, 2]
    with pytest.raises(NotExpressible):
        cuda.render(llama, cuda.CudaParams("rope", vec=4, threads=128, unroll=4))


@pytest.mark.skipif(shutil.which("g++") is None, reason="g++ is not installed")
def test_the_rope_kernels_match_the_module_on_an_emulated_gpu(programs, tmp_path):
    srcs, plan = {}, {}
    for name, (progs, _, pat) in programs.items():
        whole = [(-1, pat.program)] if pat.family == "graph" else []  # (every output in one kernel)
        for j, p in [*enumerate(progs), *whole]:
            for q in _params(p):
                key = f"{name.replace('/', '_')}_{j}_v{q.vec}_h{q.unroll}"
                srcs[key] = cuda.render(p, q)
                plan[key] = (name, j, len(progs) if j >= 0 else 1, q.vec)
    assert sum(j < 0 for _, j, _, _ in plan.values()) == 6  # (per dtype: two widths, and two heads a thread)
    libs = cuda_emulation.build(srcs, tmp_path)
    for key, path in libs.items():
        name, j, stages, vec = plan[key]
        progs, mod, _ = programs[name]
        torch.manual_seed(0)
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("REALWORLD_SUITE_SMALL", "1")
            inputs = mod.get_inputs()
        model = mod.Model(*mod.get_init_inputs()).eval()
        with torch.no_grad():
            want = model(*inputs)
        want = list(want) if isinstance(want, tuple) else [want]
        want = want[j:j + 1] if stages > 1 else want
        abi = [*inputs, *model.state_dict().values()]
        outs = [torch.full_like(w, float("nan")) for w in want]
        lib = KernelLibrary(path)
        lib([t.contiguous() for t in abi], outs, None)
        assert cuda_emulation.last_kernel(lib) == f"fb_rope_v{vec}", key
        for o, w in zip(outs, want, strict=True):
            if w.dtype == torch.bfloat16:  # every product and sum rounded where the reference rounds it
                assert torch.equal(o, w), (key, (o.float() - w.float()).abs().max())
            else:
                torch.testing.assert_close(o, w, rtol=1e-6, atol=1e-6)


LOAD = re.compile(r"\bld\.global(?:\.nc)?\.(\w+(?:\.\w+)?)")


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_rope_kernels_read_vectors_and_never_divide_64_bit_integers(programs, tmp_path):
    """Compiled to PTX (sm_90): no 64-bit div/rem anywhere in a rope kernel (it has no loop: the row's coordinates are
    multiplications by constants), and the widest kernel reads x, cos and sin only as 8- or 16-byte vectors (the
    gathered table's int64 index is one 8-byte load): no 2-byte scalar load of a bf16 element."""
    srcs, wide = [], []
    for name, (progs, _, pat) in programs.items():
        for p in progs + ([pat.program] if pat.family == "graph" else []):
            q = _params(p)[0]
            srcs.append(cuda.render(p, q))
            wide.append((name, q.vec, p))
    assert divisions_by_source(srcs, tmp_path / "div") == {}
    ptx = compile_ptx(srcs, tmp_path / "ptx")
    assert not re.search(r"\b(?:div|rem)(?:\.full)?\.[su]64\b", ptx)
    entries = re.findall(r"\.entry (\w+)\(", ptx)
    for k, (name, vec, p) in enumerate(wide):
        entry = next(e for e in entries if unit_of(e) == k and f"fb_rope_v{vec}" in e)
        body = ptx.split(f".entry {entry}(")[1].split(".entry ")[0]
        loads = LOAD.findall(body)
        size = 2 if p.out_dtype == "bfloat16" else 4
        assert loads and all(x.startswith(("v2.", "v4.")) for x in loads), (name, vec, loads)
        if vec * size == 16:  # each output's x as 16-byte vectors
            assert sum(x.startswith("v4.") for x in loads) >= len(p.rope.xs), (name, loads)
