"""The test a kernel PR ships beside its drop-in (`test_<target>.py`), as fusebot writes it: runner/results/
dropin_test.py replaces this docstring with the PR's own and the per-PR block with the PR's values.

It compares the drop-in (dropin.py beside it) with the original module over several seeds and every declared shape,
forward and gradients, with its guard, switches and shipped library; skipped without CUDA for a CUDA kernel.
"""

import copy
import importlib
import importlib.util
import inspect
import sys
from pathlib import Path

import pytest
import torch

from runner.harness.refs import resolve as _resolve  # fusebot: inline

# ---- per-PR values (fusebot writes this block for each PR)
TARGET = "target"
CLASS = "Model"
DEVICE = "cpu"
DTYPE_NAME = None  # the problem's dtype ("float32"), or None: the module's own
ATOL = None  # the problem's own tolerance, or None: each output's dtype's, from TOLERANCE
RTOL = None
TOLERANCE = {"float32": (1e-4, 1e-4)}  # (atol, rtol) per output dtype, as the harness judges it
SHAPES = ["get_inputs"]  # the input factories: the problem's inputs and its second declared shape
INIT_INPUTS = None  # the factory of the constructor's arguments, or None: INIT_ARGS
INIT_ARGS = []
INIT_KWARGS = {}
SEEDS = 3
# ---- end of per-PR values

pytestmark = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(), reason="the kernel is CUDA; no GPU")
DTYPE = getattr(torch, DTYPE_NAME) if DTYPE_NAME else None


@pytest.fixture(scope="module")
def dropin():
    """The drop-in beside this file, loaded under a name of its own."""
    spec = importlib.util.spec_from_file_location("fusebot_dropin_" + TARGET, Path(__file__).with_name("dropin.py"))
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


def _to(x):
    if isinstance(x, torch.Tensor):
        x = x.to(DEVICE)
        return x.to(DTYPE) if DTYPE is not None and x.is_floating_point() else x
    return x


def _outputs(got, want):
    """(drop-in's, original's) output pairs, for a module returning one tensor or several."""
    return zip(*(([got], [want]) if isinstance(want, torch.Tensor) else (got, want)), strict=True)


def _assert_close(got, want, scale=1.0):
    """Every output at its own dtype's tolerance (a bf16 output at bf16's, though the module computes in float32),
    unless the problem sets one; `scale` widens it (gradients)."""
    for g, w in _outputs(got, want):
        atol, rtol = TOLERANCE.get(str(w.dtype).removeprefix("torch."), TOLERANCE["float32"])
        atol, rtol = (ATOL if ATOL is not None else atol), (RTOL if RTOL is not None else rtol)
        torch.testing.assert_close(g, w, atol=atol * scale, rtol=rtol * scale)


def _pair(dropin, seed):
    torch.manual_seed(seed)
    init = _resolve(dropin._ref, INIT_INPUTS)() if INIT_INPUTS else list(INIT_ARGS)
    original = dropin.Original(*init, **INIT_KWARGS).to(DEVICE).eval()
    fused = getattr(dropin, CLASS)(*init, **INIT_KWARGS).to(DEVICE).eval()
    if DTYPE is not None:
        original, fused = original.to(DTYPE), fused.to(DTYPE)
    fused.load_state_dict(original.state_dict())
    return original, fused


def _inputs(dropin, shape, seed):
    torch.manual_seed(1000 + seed)
    return [_to(x) for x in _resolve(dropin._ref, shape)()]


def test_same_class_state_dict_signature_guard_and_switches(dropin, monkeypatch):
    original, fused = _pair(dropin, 0)
    assert list(fused.state_dict()) == list(original.state_dict())
    assert isinstance(fused, dropin.Original)
    assert inspect.signature(fused.forward) == inspect.signature(original.forward)
    inputs = _inputs(dropin, SHAPES[0], 0)
    cls = getattr(dropin, CLASS)
    with torch.no_grad():
        want = original(*inputs)
        calls = cls.kernel_calls
        monkeypatch.setenv("FUSEBOT_DISABLE", "1")
        _assert_close(fused(*inputs), want)
        monkeypatch.delenv("FUSEBOT_DISABLE")
        fused.fusebot_enabled = False
        _assert_close(fused(*inputs), want)
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
@pytest.mark.parametrize("seed", range(SEEDS))
def test_dropin_matches_original(dropin, seed, shape):
    original, fused = _pair(dropin, seed)
    inputs = _inputs(dropin, shape, seed)
    calls = getattr(dropin, CLASS).kernel_calls
    with torch.no_grad():
        want = original(*inputs)
        got = fused(*inputs)
    assert getattr(dropin, CLASS).kernel_calls == calls + 1, "the fused kernel did not run"
    _assert_close(got, want)
    for g, w in _outputs(got, want):
        if w.numel() > 1 and dropin._dense(tuple(w.shape), w.stride()):
            assert g.stride() == w.stride(), f"strides {g.stride()}, the original's {w.stride()}"


@pytest.mark.skipif(DEVICE != "cuda", reason="a CPU kernel: CUDA graphs do not apply")
def test_cuda_graph_capture_and_replay(dropin):
    original, fused = _pair(dropin, 0)
    static = _inputs(dropin, SHAPES[0], 0)
    cls = getattr(dropin, CLASS)
    with torch.no_grad():
        fused(*static)  # a first call outside the capture loads the kernel, as CUDA graphs want
        torch.cuda.synchronize()
        calls = cls.kernel_calls
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused(*static)
        assert cls.kernel_calls == calls + 1, "the kernel was not captured (the original forward ran)"
        for x, new in zip(static, _inputs(dropin, SHAPES[0], 1), strict=True):
            if isinstance(x, torch.Tensor):
                x.copy_(new)  # new values in the captured inputs
        graph.replay()
        torch.cuda.synchronize()
        want = original(*static)
    _assert_close(out, want)


@pytest.mark.parametrize("shape", SHAPES)
def test_gradients_match_original(dropin, shape):
    original, fused = _pair(dropin, 0)
    inputs = _inputs(dropin, shape, 0)
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
    for got, want in zip(grads[1], grads[0], strict=True):
        _assert_close(got, want, scale=10)
