"""runner.harness.verify compares outputs a chunk at a time (a 6 GB fp32 output must not need 60 GB of fp64 temporaries):
the chunked comparison must find the same things, with the same counts and worst element, as the whole-tensor one.
A mismatch is called reduced precision only when its errors look like rounding to a narrower format."""

import pytest
import torch

from runner.harness import verify


def _case() -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(7)
    ref = torch.randn(1000, generator=g)
    out = ref.clone()
    out[5] += 1.0  # outside tolerance
    out[517] += 0.5  # outside tolerance, in a later chunk
    out[700] = float("nan")  # poisoned
    ref[900] = float("inf")
    out[900] = float("-inf")  # Inf sign differs
    return ref, out


@pytest.mark.parametrize("chunk", [7, 64, 1 << 25])
def test_chunked_comparison_counts_every_difference_once(monkeypatch, chunk):
    monkeypatch.setattr(verify, "CHUNK_ELEMENTS", chunk)
    ref, out = _case()
    c = verify.compare_values(ref, out, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed
    assert c.mismatched == 2 + 1 + 1  # two out of tolerance, one NaN, one Inf
    assert c.max_abs_err == pytest.approx(1.0, abs=1e-6)
    text = " ".join(c.reasons)
    assert "2 of 1000 elements outside" in text and "worst at flat index 5" in text
    assert "uninitialized-output" in text and "inf-mismatch" in text


@pytest.mark.parametrize("chunk", [3, 1 << 25])
def test_chunked_comparison_passes_what_is_within_tolerance(monkeypatch, chunk):
    monkeypatch.setattr(verify, "CHUNK_ELEMENTS", chunk)
    ref = torch.linspace(-3, 3, 101)
    out = ref + 1e-6
    assert verify.compare_values(ref, out, atol=1e-4, rtol=1e-4, index=0).passed
    assert verify.matches(ref, out, atol=1e-4, rtol=1e-4)
    out[100] += 1.0
    assert not verify.matches(ref, out, atol=1e-4, rtol=1e-4)
    ints = torch.arange(50)
    other = ints.clone()
    other[49] = 0
    c = verify.compare_values(ints, other, atol=0, rtol=0, index=1)
    assert not c.passed and c.mismatched == 1


def test_a_mismatch_is_named_by_the_size_of_its_error():
    """Normwise error of fp32 rounding (an H100 GEMM+sum epilogue: 2e-7) is not called a precision downgrade; an
    error of TF32's size (1e-3) is."""
    g = torch.Generator().manual_seed(3)
    ref = torch.randn(4096, generator=g) * 4
    rounding = ref.clone()
    rounding[7] += 0.0008 + 1e-4 * abs(float(ref[7]))  # one element just out of atol/rtol 1e-4, normwise tiny
    c = verify.compare_values(ref, rounding, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed and "fp32 rounding" in c.reasons[0] and "precision downgrade" not in c.reasons[0]
    tf32 = ref * (1 + 1e-3 * torch.randn(4096, generator=g))
    c = verify.compare_values(ref, tf32, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed and "precision downgrade" in c.reasons[0]


def _scaled_and_rounded() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(5)
    ref = torch.randn(4096, generator=g) * 3
    return ref, ref * 1.01, ref.to(torch.bfloat16).float()


def test_a_uniform_scale_is_a_mismatch_at_its_worst_element_not_reduced_precision():
    ref, scaled, _ = _scaled_and_rounded()
    i = int(ref.abs().argmax())  # 1% of the largest value: the furthest out of tolerance
    c = verify.compare_values(ref, scaled, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed and c.reasons[0].startswith("mismatch: output 0:"), c.reasons
    assert f"worst at flat index {i}: got {float(scaled[i]):.6g}, expected {float(ref[i]):.6g})" in c.reasons[0]
    assert "precision" not in c.reasons[0]
    c = verify.compare_to_oracle(ref, ref.double(), scaled, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed and c.reasons[0].startswith("mismatch: output 0:"), c.reasons
    assert f"worst at flat index {i}, by " in c.reasons[0]
    assert f": got {float(scaled[i]):.6g}, expected {float(ref[i]):.6g} (the oracle)" in c.reasons[0]
    assert "precision" not in c.reasons[0]


def test_a_bias_is_not_reduced_precision_either():
    ref, _, _ = _scaled_and_rounded()
    for biased in (ref + 0.004, ref - 0.004):
        c = verify.compare_to_oracle(ref, ref.double(), biased, atol=1e-4, rtol=1e-4, index=0)
        assert not c.passed and c.reasons[0].startswith("mismatch") and "precision" not in c.reasons[0]


def test_an_output_rounded_to_bf16_is_named_reduced_precision():
    ref, _, rounded = _scaled_and_rounded()
    c = verify.compare_values(ref, rounded, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed and "typical of reduced precision" in c.reasons[0] and "precision downgrade" in c.reasons[0]
    c = verify.compare_to_oracle(ref, ref.double(), rounded, atol=1e-4, rtol=1e-4, index=0)
    assert not c.passed and c.reasons[0].startswith("mismatch") and "precision downgrade" in c.reasons[0]
