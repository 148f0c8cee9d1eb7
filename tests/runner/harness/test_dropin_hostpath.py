"""The drop-in's per-call host path, run for real on the CPU backend: a call signature (dtypes, shapes, strides,
device) is checked and its kernel path made once, and a later call of that signature only allocates its outputs,
writes in its tensors' addresses and launches; a call of any other signature after it is checked as a first call
would be, and refused or run exactly as before."""

from __future__ import annotations

import threading

import pytest
import torch

from tests.runner.harness.test_dropin import KERNEL, SPEC2, load, pair, write_folder
from tests.runner.harness.test_dropin_guard import calls_and_warnings as run


@pytest.fixture
def counted(tmp_path, monkeypatch):
    """The drop-in module, with how often it planned a call (the guard's checks, the meta run) and made a kernel
    path counted."""
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("FUSEBOT_DISABLE", raising=False)
    mod = load(write_folder(tmp_path / "out", KERNEL, SPEC2), f"dropin_hostpath_{tmp_path.name}")
    counts = {"plan": 0, "call": 0}
    plan, call = mod._plan, mod._Call

    def counting_plan(*a):
        counts["plan"] += 1
        return plan(*a)

    def counting_call(*a):
        counts["call"] += 1
        return call(*a)

    monkeypatch.setattr(mod, "_plan", counting_plan)
    monkeypatch.setattr(mod, "_Call", counting_call)
    return mod, counts


def test_a_repeated_signature_is_checked_and_made_ready_once(counted):
    mod, counts = counted
    original, fused = pair(mod)
    for k in range(5):  # new tensors (new addresses) of one signature: each call's own data
        x = torch.randn(64, 256) * (k + 1)
        out, ran, warned = run(mod, lambda x=x: fused(x))
        assert ran == 1 and not warned
        torch.testing.assert_close(out, original(x).detach())
    assert counts == {"plan": 1, "call": 1}
    out, ran, _ = run(mod, lambda: fused(torch.randn(193, 256)))  # the second verified shape: its own signature
    assert ran == 1 and counts == {"plan": 2, "call": 2}


def test_after_a_cached_call_every_other_signature_is_checked_as_before(counted):
    mod, counts = counted
    original, fused = pair(mod)
    assert run(mod, lambda: fused(torch.randn(64, 256)))[1] == 1
    cases = [  # (input, whether the kernel takes it, what the warning says)
        (torch.randn(7, 256), False, "has shape (7, 256) (verified: (64, 256)"),
        (torch.randn(64, 256, dtype=torch.float64), False, "torch.float64 (verified: torch.float32)"),
        (torch.randn(2, 64, 256), False, "3 dims (verified: 2)"),
        (torch.randn(256, 64).t(), True, None),  # other strides: copied, as the harness's own inputs were
        (torch.randn(64, 512)[:, ::2], True, None),
    ]
    for x, takes, says in cases:
        out, ran, warned = run(mod, lambda x=x: fused(x))
        torch.testing.assert_close(out, original(x).detach())
        assert ran == int(takes), (x.shape, x.stride())
        assert (says in warned[0]) if says else not warned
    assert counts["plan"] == 1 + len(cases)  # each signature checked from scratch once
    for x, takes, _ in cases:  # again: the same verdicts, from the cache, without a second warning
        out, ran, warned = run(mod, lambda x=x: fused(x))
        torch.testing.assert_close(out, original(x).detach())
        assert ran == int(takes) and not warned
    assert counts["plan"] == 1 + len(cases) and counts["call"] == 3


def test_what_is_not_part_of_the_signature_is_checked_at_every_call(counted, monkeypatch):
    mod, counts = counted
    original, fused = pair(mod)
    x = torch.randn(64, 256)
    assert run(mod, lambda: fused(x))[1] == 1
    monkeypatch.setenv("FUSEBOT_DISABLE", "1")
    assert run(mod, lambda: fused(x))[1] == 0
    monkeypatch.delenv("FUSEBOT_DISABLE")
    assert run(mod, lambda: fused(x))[1] == 1
    before = mod.Model.kernel_calls
    y = fused(x)  # grad mode, and the bias wants a gradient: the original
    assert y.requires_grad and mod.Model.kernel_calls == before
    with torch.no_grad():
        fused.bias = torch.nn.Parameter(fused.bias + 1.0)  # a replaced parameter of the same signature: its values
        original.bias += 1.0
    out, ran, _ = run(mod, lambda: fused(x))
    assert ran == 1
    torch.testing.assert_close(out, original(x).detach())
    fused.train()
    fused.drop = torch.nn.Dropout(0.5)  # training mode with a module that behaves differently there: the original
    _, ran, warned = run(mod, lambda: fused(x))
    assert ran == 0 and "training mode and Dropout" in warned[0]
    assert counts["call"] == 1


def test_calls_of_one_signature_on_several_threads_each_get_their_own_output(counted):
    mod, _ = counted
    original, fused = pair(mod)
    xs = [torch.randn(64, 256) * (k + 1) for k in range(4)]
    want = [original(x).detach() for x in xs]
    assert run(mod, lambda: fused(xs[0]))[1] == 1  # the signature's first call (its meta run swaps the module's tensors)
    errors = []

    def worker(k):
        try:
            with torch.no_grad():
                for _ in range(50):
                    torch.testing.assert_close(fused(xs[k]), want[k])
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=worker, args=(k,)) for k in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors[0]
