"""The real-world suite (bench/suites/realworld) on the CPU at CI sizes (REALWORLD_SUITE_SMALL=1).

Every problem, in fp32 and bf16: it imports (transformers and diffusers, from the `dev` extra), its reference runs
through the harness's own loader, and the catalog's capture and recognition recognise it or say why. Each recognised
problem's first catalog candidate (the first parameter set of its first strategy, on one thread) is then verified by
the real harness (Evaluator, backend "cpu"). A problem is understood when that candidate is verified. The understood
set is pinned in bench/suites/realworld/understood.json: a problem that was understood and is no longer fails the
test (with its reason), and so does one newly understood that the file does not list yet (update the file
deliberately: REALWORLD_UPDATE_UNDERSTOOD=1 rewrites it from the run).

`make test` captures and recognises every problem, generates every first candidate, and verifies a handful (one per
family and dtype) through the harness; the whole suite's verification (a judge and a contestant process per problem,
about 8 minutes on two cores) is marked `suite` and runs in `make bench-check`.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import re
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from bench.suites.realworld.make_bf16 import expected_bf16
from runner.catalog.codegen.common import NotExpressible
from runner.catalog.pattern import Pattern
from runner.catalog.recognition import recognise
from runner.contract import Candidate, Verdict
from runner.harness.evaluator import Evaluator, HarnessConfig
from runner.harness.problem import build_model, load, make_inputs
from runner.pipeline import problem_from_file
from runner.proposers.catalog import CatalogProposer, label_of, remember
from runner.search.types import ProblemContext
from tests.runner.catalog.captures import captured
from tests.runner.catalog.codegen.ptx import divisions_by_source
from tests.runner.conftest import FAST_TIMER

log = logging.getLogger(__name__)

SUITE = Path(__file__).resolve().parents[2] / "bench/suites/realworld"
DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}
EXPECTED = SUITE / "understood.json"
SMALL = "REALWORLD_SUITE_SMALL"
PROBLEMS = [f"{d}/{p.stem}" for d in DTYPES for p in sorted((SUITE / d).glob("*.py"))]
# Libraries some problems import that CI does not install (the GPU machine has them): there those problems are skipped.
OPTIONAL = ("timm", "torchvision")
LIBRARIES = ("transformers", "diffusers", *OPTIONAL)
# Processes side by side: two on CI's two cores, up to eight on a larger machine (`make bench-check`).
SIDE_BY_SIDE = max(2, min(8, (os.cpu_count() or 2) // 2))


def path_of(problem: str) -> Path:
    return SUITE / f"{problem}.py"


@functools.cache
def importable(lib: str) -> bool:
    try:
        importlib.import_module(lib)
    except Exception:  # noqa: BLE001 - not installed, or installed and broken (a torchvision built for another torch)
        return False
    return True


def missing(problem: str) -> str | None:
    """The optional library the problem imports that this machine cannot import, if any."""
    found = re.findall(r"^(?:from|import) (\w+)", path_of(problem).read_text(), re.M)
    return next((lib for lib in OPTIONAL if lib in found and not importable(lib)), None)


# the problems this machine can import (the others are skipped, with the library they need)
RUNNABLE = [p for p in PROBLEMS if not missing(p)]


@pytest.fixture(scope="module", autouse=True)
def small_sizes():
    """CI's sizes, in this process (the problems read the switch when imported) and in every process it starts."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv(SMALL, "1")
        yield


@pytest.fixture(scope="module")
def patterns(small_sizes) -> dict[str, Pattern]:
    """Every problem captured once, in confined processes side by side (transformers is imported once in each),
    and recognised; the proposers below reuse these captures."""
    sources = {p: path_of(p).read_text() for p in RUNNABLE}
    parts = [RUNNABLE[i::SIDE_BY_SIDE] for i in range(SIDE_BY_SIDE)]
    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        graphs = list(pool.map(lambda names: captured([sources[n] for n in names], timeout_s=600), parts))
    out = {}
    for names, gs in zip(parts, graphs, strict=True):
        for name, g in zip(names, gs, strict=True):
            out[name] = recognise(g)
            remember(sources[name], out[name])
    return out


def test_the_suite_has_30_problems_in_each_dtype_and_bf16_files_are_the_fp32_ones_in_bf16():
    fp32 = sorted(p.name for p in (SUITE / "fp32").glob("*.py"))
    assert len(fp32) >= 30
    want = expected_bf16()
    have = {p.name: p.read_text() for p in (SUITE / "bf16").glob("*.py")}
    assert sorted(have) == sorted(want), "run python bench/suites/realworld/make_bf16.py"
    stale = [n for n in want if have[n] != want[n]]
    assert not stale, f"bf16 copies out of step with fp32 (run python bench/suites/realworld/make_bf16.py): {stale}"


@pytest.mark.parametrize("problem", [
    pytest.param(p, marks=pytest.mark.skipif(bool(missing(p)), reason=f"{missing(p)} is not importable here"))
    for p in PROBLEMS])
def test_the_reference_runs_at_ci_sizes(problem):
    """Through the harness's own loader, on every declared shape: finite outputs, and a bf16 problem computes in bf16
    (its weights, or else its floating inputs, are bf16)."""
    spec = problem_from_file(path_of(problem))
    loaded = load(spec)
    model = build_model(loaded, loaded.model_cls, seed=0, device="cpu")
    doc = (loaded.module.__doc__ or "").strip()
    assert len(doc) > 80 and any(lib in doc for lib in LIBRARIES), "the docstring names library and class"
    for shape_set in range(loaded.shape_sets()):
        inputs = make_inputs(loaded, seed=shape_set, shape_set=shape_set, randn=None, device="cpu")
        with torch.no_grad():
            out = model(*inputs)
        outs = out if isinstance(out, tuple) else (out,)
        assert outs and all(isinstance(t, torch.Tensor) and torch.isfinite(t.float()).all() for t in outs)
        assert sum(t.numel() for t in inputs if isinstance(t, torch.Tensor)) < 1 << 16, "CI sizes are small"
        floats = [t.dtype for t in [*inputs, *model.state_dict().values()] if t.is_floating_point()]
        want = DTYPES[problem.split("/")[0]]
        assert want in floats, (problem, floats)


def first_candidate(name: str, pat: Pattern) -> Candidate:
    """What the catalog proposes first for this problem on the CPU, on one thread (on a small shared CI machine an
    OpenMP kernel's timings are too erratic for the harness's timer cross-check)."""
    prop = CatalogProposer()
    ctx = ProblemContext(name=name.replace("/", "_"), reference_source=path_of(name).read_text(), backend="cpu")
    strategies = prop.strategies(ctx)
    assert strategies, f"{name}: recognised ({pat.family}) but no strategy"
    return prop.candidate(ctx, pat, replace(strategies[0].params[0], threads="one"))


def _verify(name: str, cand: Candidate, cache: Path) -> Verdict:
    """The harness's verdict; one whose only reason is the timer cross-check is measured once more (a preempted
    process on a loaded CI machine fails it honestly; correctness is never retried)."""
    cfg = HarnessConfig(compile_baseline=False, timer=FAST_TIMER, cache_dir=cache)
    with Evaluator(problem_from_file(path_of(name)), backend="cpu", config=cfg) as ev:
        (v,) = ev.evaluate_many([cand])
        if v.reasons and all(r.startswith("timer-escape") for r in v.reasons):
            v = ev.evaluate(cand)
        return v


def _outcomes(patterns: dict[str, Pattern], names: list[str], cache: Path) -> dict[str, str]:
    """Problem -> "" where the catalog's first candidate is verified by the harness, else why not (the pattern's
    reason, or the verdict's). One Evaluator per recognised problem, SIDE_BY_SIDE at a time."""
    out = {n: f"{patterns[n].family}: {patterns[n].reason}" for n in names if patterns[n].family == "unsupported"}
    todo = [n for n in names if n not in out]
    cands = {n: first_candidate(n, patterns[n]) for n in todo}
    with ThreadPoolExecutor(SIDE_BY_SIDE) as pool:
        verdicts = dict(zip(todo, pool.map(lambda n: _verify(n, cands[n], cache), todo), strict=True))
    for n, v in verdicts.items():
        out[n] = "" if v.accepted and v.timing and v.timing.median_ms > 0 else \
            f"{patterns[n].family}, candidate {label_of(cands[n])} rejected: {'; '.join(v.reasons)[:300]}"
    return out


def test_every_pinned_problem_is_recognised_and_has_a_first_candidate(patterns):
    """What `make test` checks of the whole suite without a harness process per problem: every problem the pin
    lists as understood is still recognised and the catalog still generates its first candidate; every other problem
    says why it is not."""
    pinned = json.loads(EXPECTED.read_text())
    for name, pat in patterns.items():
        d, stem = name.split("/")
        if stem in pinned[d]:
            assert pat.family != "unsupported", f"{name} is pinned as understood, but: {pat.reason}"
            cand = first_candidate(name, pat)
            assert cand.sources and label_of(cand), name
        else:
            assert pat.family != "unsupported" or pat.reason.strip(), name


# One problem of each family in each dtype, verified end to end in `make test`.
HANDFUL = ["fp32/llama_rmsnorm", "bf16/gpt2_new_gelu", "fp32/gpt2_causal_softmax", "bf16/llama_swiglu",
           "fp32/bert_residual_layernorm", "bf16/gpt2_lm_loss"]


def test_a_handful_of_problems_are_verified_end_to_end(patterns, harness_cache):
    pinned = json.loads(EXPECTED.read_text())
    names = [n for n in HANDFUL if n.split("/")[1] in pinned[n.split("/")[0]]]
    assert len(names) == len(HANDFUL), "the handful are pinned as understood"
    outcomes = _outcomes(patterns, names, harness_cache)
    assert {n: why for n, why in outcomes.items() if why} == {}


@pytest.mark.suite
def test_every_problem_is_understood_or_says_why(patterns, harness_cache):
    """Understood = recognised and its first candidate verified. The set is pinned: losing one fails, and so does
    gaining one until understood.json lists it."""
    outcomes = _outcomes(patterns, list(patterns), harness_cache)
    assert all(why.strip() for why in outcomes.values() if why != ""), "every problem not understood says why"
    now = {d: sorted(n.split("/")[1] for n, why in outcomes.items() if n.startswith(d + "/") and why == "")
           for d in DTYPES}
    for d in DTYPES:
        log.info("understood %s: %d of %d", d, len(now[d]), sum(n.startswith(d + "/") for n in outcomes))
    for n, why in sorted(outcomes.items()):
        if why:
            log.info("not understood: %s: %s", n, why)
    if os.environ.get("REALWORLD_UPDATE_UNDERSTOOD") == "1":
        EXPECTED.write_text(json.dumps(now, indent=1) + "\n")
    pinned = json.loads(EXPECTED.read_text())
    lost = [f"{d}/{n}: {outcomes[f'{d}/{n}']}" for d in DTYPES for n in pinned[d]
            if n not in now[d] and f"{d}/{n}" in outcomes]  # (one whose library is not importable here: not run)
    gained = [f"{d}/{n}" for d in DTYPES for n in now[d] if n not in pinned[d]]
    assert not lost, "no longer understood:\n" + "\n".join(lost)
    assert not gained, (f"newly understood: {', '.join(gained)}; add them to {EXPECTED.name} "
                        "(REALWORLD_UPDATE_UNDERSTOOD=1 rewrites it)")


# ---- the generated CUDA's index arithmetic ----------------------------------------------------------------------

# the problems whose programs hold every kind of index the templates render (an Iota along the row and across rows,
# strided and reshaped views, a gathered row, broadcast, rowblock and column inputs): the default run compiles one
# instantiation of each layout of each; the exhaustive run every code shape of every problem in both dtypes
INDEX_PROBLEMS = ("fp32/gpt2_causal_softmax", "fp32/gptj_interleaved_rope", "fp32/t5_position_bias_softmax",
                  "fp32/diffusers_groupnorm_silu", "fp32/masked_mean_pooling", "fp32/bert_embeddings")


def cuda_sources(patterns: dict[str, Pattern], names, shape) -> dict[str, str]:
    """'problem label' -> the CUDA source of every parameter set the catalog proposes for the named problems, one per
    distinct shape(params) of a problem."""
    out: dict[str, str] = {}
    for name in names:
        prop = CatalogProposer()
        ctx = ProblemContext(name=name.replace("/", "_"), reference_source=path_of(name).read_text(), backend="cuda")
        seen = set()
        for s in prop.strategies(ctx):
            for p in s.params:
                if shape(p) in seen:
                    continue
                try:
                    cand = prop.candidate(ctx, patterns[name], p)
                except NotExpressible:
                    continue
                seen.add(shape(p))
                for file, text in cand.sources.items():
                    if file.endswith(".cu"):
                        out[f"{name} {p.label()} {file}"] = text
    return out


def _assert_no_division_in_loops(sources: dict[str, str], where: Path, parts: int = 2) -> None:
    """Compiled to PTX in `parts` nvcc runs side by side: no 64-bit division or remainder inside any kernel's loop."""
    names = list(sources)
    chunks = [names[k::parts] for k in range(parts)]
    with ThreadPoolExecutor(parts) as pool:
        found = list(pool.map(lambda c: (c[1], divisions_by_source([sources[n] for n in c[1]], where / str(c[0]))),
                              enumerate(chunks)))
    bad = [f"{chunk[k]}: {entry}: {', '.join(lines[:3])} ({len(lines)})"
           for chunk, by_source in found for k, kernels in sorted(by_source.items()) for entry, lines in kernels.items()]
    assert not bad, f"{len(bad)} kernels divide 64-bit integers inside a loop:\n" + "\n".join(bad[:40])


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_the_index_arithmetic_of_every_layout_has_no_64_bit_division_in_a_loop(patterns, tmp_path):
    """One instantiation per layout of each problem in INDEX_PROBLEMS, compiled to PTX: the coordinates along the
    traversed dim are loop counters, sizes the source is specialised on are constants and any other size is divided
    by through magic numbers, so no loop holds a div/rem .s64/.u64."""
    sources = cuda_sources(patterns, INDEX_PROBLEMS, lambda p: p.layout)
    assert len({k.split()[1].split("-")[1] for k in sources}) >= 6, sorted(sources)
    _assert_no_division_in_loops(sources, tmp_path)


@pytest.mark.exhaustive
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_no_instantiation_of_the_suite_divides_64_bit_integers_in_a_loop(patterns, tmp_path):
    """Every code shape the catalog proposes for every problem, both dtypes (minutes: `pytest -m exhaustive`)."""
    def shape(p):
        return (p.layout, p.vec == 1, p.mode, p.group == 32, p.chunks > 1, p.buffers, p.grid, p.interleave, p.fast_math)

    sources = cuda_sources(patterns, [n for n in RUNNABLE if patterns[n].program is not None], shape)
    assert len(sources) > 200
    _assert_no_division_in_loops(sources, tmp_path)
