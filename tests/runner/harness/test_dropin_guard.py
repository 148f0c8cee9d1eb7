"""The drop-in's guard, run for real on the CPU backend: the kernel takes only what it was verified for, everything
else runs the original forward with one warning per reason; the switches; the kernel's own error messages."""

from __future__ import annotations

import warnings

import pytest
import torch

from tests.runner.harness.test_dropin import KERNEL, SPEC2, load, pair, write_folder

# A catalog kernel reads every size from the call's tensors (its marker line) and says why it refuses a call.
PICKY = """// fusebot catalog: test
#include <stdio.h>
#include "fusebot.h"
static char fb_err[128];
FB_EXPORT const char* fusebot_last_error(void) { return fb_err; }
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  (void)stream; (void)n_in; (void)n_out;
  if (in[0].shape[0] % 2) { snprintf(fb_err, sizeof fb_err, "rows must be even, got %lld", (long long)in[0].shape[0]);
                            return 7; }
  const float* x = (const float*)in[0].data; const float* b = (const float*)in[1].data; float* y = (float*)out[0].data;
  const int64_t rows = in[0].shape[0], cols = in[0].shape[1];
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) { float v = x[r * cols + c] * 2.0f + b[c]; y[r * cols + c] = v < 0.0f ? 0.0f : v; }
  return 0;
}
"""


@pytest.fixture
def mod(tmp_path, monkeypatch, request):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSEBOT_DISABLE", raising=False)
    kernel = getattr(request, "param", KERNEL)
    return load(write_folder(tmp_path / "out", kernel, SPEC2), f"dropin_guard_{tmp_path.name}")


def calls_and_warnings(mod, fn):
    before = mod.Model.kernel_calls
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        with torch.no_grad():
            out = fn()
    return out, mod.Model.kernel_calls - before, [str(w.message) for w in seen if w.category is mod.FallbackWarning]


def test_outside_what_was_verified_it_calls_the_original_warning_once_per_reason(mod):
    original, fused = pair(mod)
    cases = [
        ("shape", lambda: torch.randn(7, 256)),  # sizes: this kernel may build them in
        ("dtype", lambda: torch.randn(64, 256, dtype=torch.float64)),
        ("dtype", lambda: torch.randn(64, 256, dtype=torch.bfloat16)),
        ("rank", lambda: torch.randn(2, 64, 256)),
        ("shape", lambda: torch.randn(0, 256)),  # empty
    ]
    said = []
    for reason, make in cases:
        x = make()
        want = original(x).detach()
        got, ran, warned = calls_and_warnings(mod, lambda x=x: fused(x))
        torch.testing.assert_close(got, want)
        assert ran == 0, reason
        said += warned
    assert len(said) == 3, said  # once per reason: shape, dtype, rank
    assert "has shape (7, 256) (verified: (64, 256)" in said[0] and "torch.float64 (verified: torch.float32)" in said[1]
    assert "3 dims (verified: 2)" in said[2] and all("the original forward runs" in s for s in said)
    for rows in (64, 193):  # both declared shape sets: the kernel
        _, ran, warned = calls_and_warnings(mod, lambda rows=rows: fused(torch.randn(rows, 256)))
        assert ran == 1 and not warned


def test_another_device_a_non_contiguous_input_and_a_replaced_parameter(mod):
    original, fused = pair(mod)
    meta = mod.Model(256).to("meta").eval()
    out, ran, warned = calls_and_warnings(mod, lambda: meta(torch.randn(64, 256, device="meta")))
    assert out.device.type == "meta" and out.shape == (64, 256) and ran == 0
    assert "tensors on meta (the kernel runs on one cpu device)" in warned[0]
    x = torch.randn(256, 64).t()  # non-contiguous: copied, as the harness's own inputs were
    out, ran, _ = calls_and_warnings(mod, lambda: fused(x))
    assert ran == 1
    torch.testing.assert_close(out, original(x).detach())
    with torch.no_grad():
        fused.bias = torch.nn.Parameter(torch.randn(128))  # a state tensor of another shape: the original
    _, ran, warned = calls_and_warnings(mod, lambda: fused(torch.randn(64, 128)))
    assert ran == 0 and "input 0 (an argument) has shape (64, 128)" in warned[0]


def test_keyword_calls_and_the_signature_are_the_originals(mod):
    import inspect

    original, fused = pair(mod)
    assert inspect.signature(fused.forward) == inspect.signature(original.forward)
    x = torch.randn(64, 256)
    out, ran, _ = calls_and_warnings(mod, lambda: fused(x=x))
    assert ran == 1
    torch.testing.assert_close(out, original(x).detach())
    _, ran, _ = calls_and_warnings(mod, lambda: fused.forward(x))
    assert ran == 1
    with pytest.raises(TypeError):  # the original's own error for a call it refuses
        fused(x, x)


def test_switches_turn_the_kernel_off(mod, monkeypatch):
    original, fused = pair(mod)
    x = torch.randn(64, 256)
    for value in ("1", "scale_relu", "other,Model"):
        monkeypatch.setenv("FUSEBOT_DISABLE", value)
        out, ran, warned = calls_and_warnings(mod, lambda: fused(x))
        assert ran == 0 and not warned, value
        torch.testing.assert_close(out, original(x).detach())
    monkeypatch.setenv("FUSEBOT_DISABLE", "another_target")
    assert calls_and_warnings(mod, lambda: fused(x))[1] == 1
    monkeypatch.delenv("FUSEBOT_DISABLE")
    fused.fusebot_enabled = False  # one instance
    assert calls_and_warnings(mod, lambda: fused(x))[1] == 0
    del fused.fusebot_enabled
    mod.Model.fusebot_enabled = False  # the class
    assert calls_and_warnings(mod, lambda: fused(x))[1] == 0
    mod.Model.fusebot_enabled = True
    assert calls_and_warnings(mod, lambda: fused(x))[1] == 1


def test_gradients_and_training_mode_run_the_original(mod):
    original, fused = pair(mod)
    x = torch.randn(64, 256)
    before = mod.Model.kernel_calls
    y = fused(x)  # the bias wants a gradient
    y.sum().backward()
    assert mod.Model.kernel_calls == before and fused.bias.grad is not None
    fused.train()
    with torch.no_grad():  # training mode, but nothing in it behaves differently there: the kernel
        fused(x)
    assert mod.Model.kernel_calls == before + 1
    fused.drop = torch.nn.Dropout(0.5)  # now something does
    _, ran, warned = calls_and_warnings(mod, lambda: fused(x))
    assert ran == 0 and "training mode and Dropout" in warned[0]


@pytest.mark.parametrize("mod", [PICKY], indirect=True)
def test_a_size_generic_kernel_takes_other_sizes_and_its_errors_carry_its_message(mod):
    original, fused = pair(mod)
    assert mod._sizes() == {}
    x = torch.randn(10, 256)  # not a declared shape, but the kernel reads its sizes from the call
    out, ran, warned = calls_and_warnings(mod, lambda: fused(x))
    assert ran == 1 and not warned
    torch.testing.assert_close(out, original(x).detach())
    x = torch.randn(9, 256)  # a size it refuses: the original, with the kernel's own reason
    out, ran, warned = calls_and_warnings(mod, lambda: fused(x))
    assert ran == 0 and "rows must be even, got 9" in warned[0]
    torch.testing.assert_close(out, original(x).detach())
    _, ran, _ = calls_and_warnings(mod, lambda: fused(torch.randn(3, 2, 256)))  # rank: still refused
    assert ran == 0
    with pytest.raises(RuntimeError, match="rows must be even, got 193"), torch.no_grad():  # a verified shape: raised
        fused(torch.randn(193, 256))


SIZED = PICKY.replace("// fusebot catalog: test\n", "// fusebot catalog: test\n// fusebot-sizes: in0=d0,256 in1=256\n")


@pytest.mark.parametrize("mod", [SIZED], indirect=True)
def test_the_sources_sizes_line_says_which_dims_follow_the_call(mod):
    original, fused = pair(mod)
    assert mod._sizes() == {0: ("d0", 256), 1: (256,)}
    x = torch.randn(10, 256)  # rows: a run-time size
    out, ran, warned = calls_and_warnings(mod, lambda: fused(x))
    assert ran == 1 and not warned
    torch.testing.assert_close(out, original(x).detach())
    with torch.no_grad():
        fused.bias = torch.nn.Parameter(torch.randn(128))
    _, ran, warned = calls_and_warnings(mod, lambda: fused(torch.randn(10, 128)))  # columns: built in
    assert ran == 0 and "has size 128 along dim 1 (the kernel is built for 256)" in warned[0]
    seen = {}
    assert mod._size_miss((4, 8), ("d0", 8), seen) is None and seen == {"d0": 4}
    assert "where another input has 4" in mod._size_miss((5,), ("d0",), seen)
    assert mod._size_miss((2, 3), 6, {}) is None and "9 elements (the kernel is built for 6)" in mod._size_miss((3, 3), 6, {})


def test_a_kernels_fixed_sizes_are_read_from_its_source(mod, tmp_path):
    text = "// fusebot catalog: x\n// fixed sizes: none\n" + \
        '    if (want != 16384LL) return fb_fail("input 0: size differs from the captured view");\n'
    (tmp_path / "out" / "kernel.cpp").write_text(text)
    mod._SIZES.clear()
    assert mod._sizes() == {0: 16384}
    (tmp_path / "out" / "kernel.cpp").write_text("// fusebot catalog: x\n// fixed sizes: R=1024\n")
    mod._SIZES.clear()
    assert mod._sizes() is None  # a row length built in: only the verified shapes
    (tmp_path / "out" / "kernel.cpp").write_text(KERNEL)  # no catalog marker (an LLM's kernel): only those too
    mod._SIZES.clear()
    assert mod._sizes() is None


def test_strict_mode_raises_instead_of_falling_back(mod):
    _, fused = pair(mod)
    mod.STRICT = True
    with pytest.raises(RuntimeError, match="torch.float64"), torch.no_grad():
        fused(torch.randn(64, 256, dtype=torch.float64))


TRANSPOSED = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self, features):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))

    def forward(self, x):
        return torch.relu(x * 2.0 + self.bias).t()  # a transposed view: the caller sees these strides


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
"""
# the same kernel writing the transposed output contiguously: y[c, r]
KERNEL_T = KERNEL.replace("y[r * cols + c] = v < 0.0f ? 0.0f : v;", "y[c * rows + r] = v < 0.0f ? 0.0f : v;")


def test_the_output_has_the_originals_layout(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    spec = SPEC2.model_copy(update={"second_inputs": None})
    m = load(write_folder(tmp_path / "out", KERNEL_T, spec, reference=TRANSPOSED), f"dropin_t_{tmp_path.name}")
    original, fused = pair(m)
    x = torch.randn(64, 256)
    with torch.no_grad():
        want, got = original(x), fused(x)
    assert m.Model.kernel_calls == 1
    assert got.shape == want.shape == (256, 64) and got.stride() == want.stride() == (1, 256)
    torch.testing.assert_close(got, want)


MASKED = """import torch
import torch.nn as nn


class Model(nn.Module):
    real_calls = 0  # forwards run on real tensors

    def __init__(self, features: int):
        super().__init__()
        self.bias = nn.Parameter(torch.randn(features))
        self.scale = 2.0
        self.register_buffer("keep", torch.ones(features, dtype=torch.bool), persistent=False)

    def forward(self, x):
        if not x.is_meta:
            Model.real_calls += 1
        return torch.where(self.keep, torch.relu(x * self.scale + self.bias), 0.0)


def get_inputs():
    return [torch.randn(64, 256)]


def get_init_inputs():
    return [256]
"""


def test_a_new_size_is_planned_on_meta_tensors_even_with_a_non_persistent_buffer(tmp_path, monkeypatch):
    """The output's layout comes from the original run on meta tensors: the buffers state_dict leaves out go to meta
    too, so the first call of a size runs the kernel alone and never the original (a profiler would see it rerun)."""
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    spec = SPEC2.model_copy(update={"second_inputs": None})
    m = load(write_folder(tmp_path / "out", KERNEL, spec, reference=MASKED), f"dropin_m_{tmp_path.name}")
    original, fused = pair(m)
    x = torch.randn(64, 256)
    with torch.no_grad():
        got = fused(x)
        assert (m.Model.kernel_calls, m.Original.real_calls) == (1, 0)
        torch.testing.assert_close(got, original(x))


def test_merged_dims_take_any_sizes_whose_product_is_the_kernels_dim(mod):
    """GroupNorm's input [N, C, H, W] read as [N, G, C/G, H*W]: `// fusebot-sizes: in0=d0,16,m3,m3` takes any H and
    W, and the product H*W is the kernel's dim 3, shared with any other input that names d3."""
    rule = ("d0", 16, "m3", "m3")
    assert mod._size_miss((2, 16, 6, 5), rule, {}) is None
    assert mod._size_miss((3, 16, 9, 7), rule, {}) is None
    assert mod._size_miss((2, 16, 5, 6), rule, {"d3": 30}) is None
    assert "merged dims" in mod._size_miss((2, 16, 5, 5), rule, {"d3": 30})
    assert "built for 16" in mod._size_miss((2, 8, 6, 5), rule, {})
