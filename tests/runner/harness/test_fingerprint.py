"""Fingerprints of whole outputs (runner.harness.fingerprint): an output within the verification rule passes, one
that skipped part of its work, or put NaN where the reference has none, does not."""

import pytest
import torch

from runner.harness import fingerprint


def case(n: int = 100_000):
    g = torch.Generator().manual_seed(0)
    oracle = torch.randn(n, generator=g, dtype=torch.float64)
    ref = oracle.float()  # eager's own rounding
    return ref, oracle


def check(got: torch.Tensor, ref, oracle, seed: int = 7):
    return fingerprint.mismatch(fingerprint.of(got, seed).tolist(),
                                fingerprint.expected(ref, oracle, 1e-4, 1e-4, seed))


def test_an_output_within_the_rule_passes():
    ref, oracle = case()
    assert check(ref, ref, oracle) is None
    assert check(ref + 5e-5, ref, oracle) is None  # within atol of every element


@pytest.mark.parametrize("broken", ["skipped_one_percent", "nan", "sign", "stale"])
def test_an_output_that_skipped_work_fails(broken):
    ref, oracle = case()
    got = ref.clone()
    if broken == "skipped_one_percent":
        got[::100] = 0.0
    elif broken == "stale":
        got = case()[0] * 0.9  # another call's output: its inputs had another scale
    elif broken == "nan":
        got[3] = float("nan")
    else:
        got = -got
    assert check(got, ref, oracle) is not None


def test_a_sum_does_not_see_one_wrong_element_in_many():
    """The limit of a summed rule: one element off by 1.0 in 100,000 is inside the summed tolerance (the trials and
    the timed calls' samples check elements one by one)."""
    ref, oracle = case()
    got = ref.clone()
    got[12345] += 1.0
    assert check(got, ref, oracle) is None


def test_non_finite_values_must_be_where_the_reference_has_them():
    ref, oracle = case(1000)
    ref[5] = float("inf")
    got = ref.clone()
    assert check(got, ref, oracle) is None
    got[5] = 0.0
    assert "non-finite" in check(got, ref, oracle)


def test_chunks_fold_the_same_weights_as_one_pass(monkeypatch):
    ref, oracle = case(3 * fingerprint.PERIOD + 17)
    whole = fingerprint.of(ref, 3)
    monkeypatch.setattr(fingerprint, "CHUNK", fingerprint.PERIOD)
    monkeypatch.setattr(fingerprint, "CPU_CHUNK", fingerprint.PERIOD)
    assert torch.allclose(fingerprint.of(ref, 3), whole, rtol=1e-12, atol=0)
    assert torch.allclose(fingerprint._few_reads(ref, 3), whole, rtol=1e-12, atol=0)


def test_a_malformed_fingerprint_is_named():
    ref, oracle = case(10)
    assert "malformed" in fingerprint.mismatch("0", fingerprint.expected(ref, oracle, 1e-4, 1e-4, 1))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int32, torch.bool])
def test_every_path_takes_the_same_fingerprint(monkeypatch, dtype):
    """The nine operations (a small CUDA output), the few reads (a large one) and the CPU's steps that stay in cache
    are the same sums: a length that is no multiple of the weights' period nor of a step, non-finite elements, a
    non-float output."""
    x = torch.randn(3 * fingerprint.PERIOD + 17, generator=torch.Generator().manual_seed(1)) * 100
    x[5], x[6], x[7] = float("nan"), float("inf"), -float("inf")
    x = x > 0 if dtype == torch.bool else x.to(torch.int32) if dtype == torch.int32 else x.to(dtype)
    wide = x if x.is_floating_point() else x.to(torch.float64)
    few_ops, few_reads = fingerprint._few_ops(wide, 11), fingerprint._few_reads(wide, 11)
    monkeypatch.setattr(fingerprint, "CPU_CHUNK", 2 * fingerprint.PERIOD)  # two steps and a part
    in_cache = fingerprint.of(x, 11)
    assert few_ops.tolist() == pytest.approx(few_reads.tolist(), rel=1e-12)
    assert in_cache.tolist() == pytest.approx(few_reads.tolist(), rel=1e-12)
    assert in_cache[2].item() == (3 if dtype in (torch.float32, torch.bfloat16) else 0)


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", fingerprint.ONE_PASS_DTYPES)
def test_the_one_pass_kernel_takes_the_same_fingerprint_as_the_torch_paths(monkeypatch, dtype):
    """(CUDA, Triton) The one-pass kernel's sums are the torch paths': a length that is no multiple of the weights'
    period, of a block or of a launch's chunk (two launches), non-finite elements, a view that starts mid-storage and
    a non-contiguous output; and an output within the rule still passes the judge's check, one that skipped work
    does not."""
    if fingerprint.triton is None:
        pytest.skip("no Triton in this build of torch")
    monkeypatch.setattr(fingerprint, "ONE_PASS_CHUNK", 5 * fingerprint.PERIOD)
    g = torch.Generator(device="cuda").manual_seed(2)
    base = torch.randn(7 * fingerprint.PERIOD + 29, generator=g, device="cuda") * 100
    base[5], base[6], base[7] = float("nan"), float("inf"), -float("inf")
    base = base.to(dtype)
    for x in (base, base[3:], base[: 2 * fingerprint.PERIOD].view(2, -1).t()):
        want = fingerprint._few_reads(x.contiguous().reshape(-1), 13)
        got = fingerprint.of(x, 13)
        assert got.tolist() == pytest.approx(want.tolist(), rel=1e-12)
    ref = torch.randn(3 * fingerprint.PERIOD + 5, generator=g, device="cuda").to(dtype)
    oracle = ref.double()
    want = fingerprint.expected(ref, oracle, 1e-4, 1e-4, 5)
    assert fingerprint.mismatch(fingerprint.of(ref, 5).tolist(), want) is None
    skipped = ref.clone()
    skipped[: ref.numel() // 10] = 0
    assert fingerprint.mismatch(fingerprint.of(skipped, 5).tolist(), want) is not None
