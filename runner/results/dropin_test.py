"""The drop-in's test module: pytest source comparing the drop-in with the original module over several seeds and
every declared shape (values and the output's layout), its guard (another dtype calls the original, with a warning),
its switches (FUSEBOT_DISABLE, `fusebot_enabled`), the shipped library being what runs where it fits, for a CUDA
kernel its capture and replay in a CUDA graph, and gradients (which the original forward computes). Skipped without
CUDA for a CUDA kernel. Pure: problem in, text out."""

from __future__ import annotations

from runner.contract import DEFAULT_TOLERANCE, ProblemSpec
from runner.harness.refs import resolve_source

TEST_FILE = "test_dropin.py"
DEFAULT_SEEDS = 3


def tolerance(problem: ProblemSpec) -> tuple[float, float]:
    atol, rtol = DEFAULT_TOLERANCE[problem.dtype or "float32"]
    return (problem.atol if problem.atol is not None else atol, problem.rtol if problem.rtol is not None else rtol)


def dropin_test_source(problem: ProblemSpec, backend: str, seeds: int = DEFAULT_SEEDS) -> str:
    """A pytest module comparing the drop-in with the original over several seeds and every declared shape, forward
    and gradients, with its guard, switches and shipped library (skipped without CUDA for a CUDA kernel)."""
    atol, rtol = tolerance(problem)
    init = f"_resolve(dropin._ref, {problem.init_inputs!r})()" if problem.init_inputs else repr(problem.init_args)
    dtype = f"torch.{problem.dtype}" if problem.dtype else "None"
    device = "cuda" if backend == "cuda" else "cpu"
    shapes = [problem.inputs] + ([problem.second_inputs] if problem.second_inputs else [])
    skip = ('pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="the kernel is CUDA; no GPU")\n'
            if backend == "cuda" else "")
    resolve = resolve_source()
    return f'''"""The fused drop-in for {problem.name} against the original {problem.class_name}, by fusebot."""

import copy
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch

_spec = importlib.util.spec_from_file_location("fusebot_dropin_{problem.name}", Path(__file__).with_name("dropin.py"))
dropin = importlib.util.module_from_spec(_spec)
sys.modules[_spec.name] = dropin
_spec.loader.exec_module(dropin)
{skip}
DEVICE = {device!r}
DTYPE = {dtype}
ATOL, RTOL = {atol!r}, {rtol!r}
SHAPES = {shapes!r}  # the input factories: the problem's inputs and its second declared shape


{resolve}

def _to(x):
    if isinstance(x, torch.Tensor):
        x = x.to(DEVICE)
        return x.to(DTYPE) if DTYPE is not None and x.is_floating_point() else x
    return x


def _pair(seed):
    torch.manual_seed(seed)
    init = {init}
    original = dropin.Original(*init, **{problem.init_kwargs!r}).to(DEVICE).eval()
    fused = dropin.{problem.class_name}(*init, **{problem.init_kwargs!r}).to(DEVICE).eval()
    if DTYPE is not None:
        original, fused = original.to(DTYPE), fused.to(DTYPE)
    fused.load_state_dict(original.state_dict())
    return original, fused


def _inputs(shape, seed):
    torch.manual_seed(1000 + seed)
    return [_to(x) for x in _resolve(dropin._ref, shape)()]


def test_same_class_state_dict_signature_guard_and_switches(monkeypatch):
    original, fused = _pair(0)
    assert list(fused.state_dict()) == list(original.state_dict())
    assert isinstance(fused, dropin.Original)
    assert inspect.signature(fused.forward) == inspect.signature(original.forward)
    inputs = _inputs(SHAPES[0], 0)
    cls = dropin.{problem.class_name}
    with torch.no_grad():
        want = original(*inputs)
        calls = cls.kernel_calls
        monkeypatch.setenv("FUSEBOT_DISABLE", "1")
        torch.testing.assert_close(fused(*inputs), want, atol=ATOL, rtol=RTOL)
        monkeypatch.delenv("FUSEBOT_DISABLE")
        fused.fusebot_enabled = False
        torch.testing.assert_close(fused(*inputs), want, atol=ATOL, rtol=RTOL)
        assert cls.kernel_calls == calls, "switched off, the kernel still ran"
        del fused.fusebot_enabled
        other = torch.float32 if (DTYPE or torch.float32) == torch.float64 else torch.float64
        moved = [x.to(other) if isinstance(x, torch.Tensor) and x.is_floating_point() else x for x in inputs]
        try:
            want_other = copy.deepcopy(original).to(other)(*moved)
        except Exception:  # noqa: BLE001 - the original itself does not run in that dtype
            want_other = None
        if want_other is not None:
            dropin._SEEN.discard("dtype")
            with pytest.warns(dropin.FallbackWarning):
                got = copy.deepcopy(fused).to(other)(*moved)
            torch.testing.assert_close(got, want_other)
            assert cls.kernel_calls == calls, "a dtype it was not verified for ran the kernel"
    device = torch.device(DEVICE)
    arch = dropin._host_arch(device if DEVICE == "cuda" else None)
    if any(dropin._fits(a, arch) for a in dropin.SHIPPED):
        assert dropin._shipped(arch) is not None, "the shipped library fits this host but was refused"
    if dropin.DEVICE_CODE and DEVICE == "cuda":  # device code only: it loads here, and no host library did
        dropin._device_image(device)
        assert not dropin._LIBS, "a host library was loaded beside the shipped device code"


@pytest.mark.parametrize("shape", SHAPES)
@pytest.mark.parametrize("seed", range({seeds}))
def test_dropin_matches_original(seed, shape):
    original, fused = _pair(seed)
    inputs = _inputs(shape, seed)
    calls = dropin.{problem.class_name}.kernel_calls
    with torch.no_grad():
        want = original(*inputs)
        got = fused(*inputs)
    assert dropin.{problem.class_name}.kernel_calls == calls + 1, "the fused kernel did not run"
    torch.testing.assert_close(got, want, atol=ATOL, rtol=RTOL)
    for g, w in zip([got] if isinstance(got, torch.Tensor) else got, [want] if isinstance(want, torch.Tensor) else want):
        if w.numel() > 1 and dropin._dense(tuple(w.shape), w.stride()):
            assert g.stride() == w.stride(), f"strides {{g.stride()}}, the original's {{w.stride()}}"


@pytest.mark.skipif(DEVICE != "cuda", reason="a CPU kernel: CUDA graphs do not apply")
def test_cuda_graph_capture_and_replay():
    original, fused = _pair(0)
    static = _inputs(SHAPES[0], 0)
    cls = dropin.{problem.class_name}
    with torch.no_grad():
        fused(*static)  # a first call outside the capture loads the kernel, as CUDA graphs want
        torch.cuda.synchronize()
        calls = cls.kernel_calls
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused(*static)
        assert cls.kernel_calls == calls + 1, "the kernel was not captured (the original forward ran)"
        for x, new in zip(static, _inputs(SHAPES[0], 1)):
            if isinstance(x, torch.Tensor):
                x.copy_(new)  # new values in the captured inputs
        graph.replay()
        torch.cuda.synchronize()
        want = original(*static)
    torch.testing.assert_close(out, want, atol=ATOL, rtol=RTOL)


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_match_original(shape):
    original, fused = _pair(0)
    inputs = _inputs(shape, 0)
    grads = []
    for model in (original, fused):
        xs = [x.detach().clone().requires_grad_(x.is_floating_point()) if isinstance(x, torch.Tensor) else x
              for x in inputs]
        out = model(*xs)
        outs = [out] if isinstance(out, torch.Tensor) else list(out)
        torch.manual_seed(7)
        sum(o.mul(torch.randn_like(o)).sum() for o in outs if o.is_floating_point()).backward()
        leaves = [x for x in xs if isinstance(x, torch.Tensor) and x.requires_grad] + list(model.parameters())
        grads.append([torch.zeros(()) if t.grad is None else t.grad for t in leaves])
    for got, want in zip(grads[1], grads[0]):
        torch.testing.assert_close(got, want, atol=ATOL * 10, rtol=RTOL * 10)
'''
