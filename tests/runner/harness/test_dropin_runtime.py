"""The drop-in's library loading: the shipped library on a host without a compiler (nothing written anywhere), a
tampered one refused, the arch it fits, and the scratch-memory protocol of fusebot_set_workspace."""

from __future__ import annotations

import ctypes
import os
import subprocess
import sys

import pytest
import torch

from runner.harness import build
from tests.runner.harness.test_dropin import KERNEL, SPEC2, load, pair, write_folder

CALL = """
import importlib.util, sys, warnings, torch
spec = importlib.util.spec_from_file_location("shipped_dropin", {path!r})
mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
torch.manual_seed(0)
original = mod.Original(256).eval(); fused = mod.Model(256).eval(); fused.load_state_dict(original.state_dict())
x = torch.randn(64, 256)
with warnings.catch_warnings(record=True) as seen, torch.no_grad():
    warnings.simplefilter("always")
    torch.testing.assert_close(fused(x), original(x))
print("kernel_calls", mod.Model.kernel_calls)
for w in seen:
    print("warning", w.message)
"""


def run_dropin(folder, tmp_path, path_env):
    """Call the drop-in in a fresh process with PATH `path_env` and a HOME and cache it could write to."""
    env = {"PATH": path_env, "HOME": str(tmp_path / "home"), "FUSEBOT_DROPIN_CACHE": str(tmp_path / "cache"),
           "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
    done = subprocess.run([sys.executable, "-c", CALL.format(path=str(folder / "dropin.py"))], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_a_host_without_a_compiler_runs_the_shipped_library_and_writes_nothing(tmp_path):
    folder = write_folder(tmp_path / "out", KERNEL, SPEC2, ship=True)
    assert list(folder.glob("kernel.*.so.b64"))
    out = run_dropin(folder, tmp_path, "/nonexistent")  # no g++, no nvcc
    assert "kernel_calls 1" in out and "warning" not in out
    assert not (tmp_path / "cache").exists() and not (tmp_path / "home").exists()


def test_a_tampered_library_is_refused(tmp_path):
    folder = write_folder(tmp_path / "out", KERNEL, SPEC2, ship=True)
    shipped = next(folder.glob("kernel.*.so.b64"))
    lines = shipped.read_text().splitlines()
    # another library's bytes, well-formed: only the recorded sha256 tells them apart
    from runner.harness.dropin_ship import decode, encode

    other = encode("x", decode(shipped.read_text()) + b"\0")
    shipped.write_text("\n".join([lines[0], *other.text.splitlines()[1:]]) + "\n")
    out = run_dropin(folder, tmp_path, "/nonexistent")  # and no compiler: the original, saying what is needed
    assert "kernel_calls 0" in out
    assert "does not have the sha256 recorded" in out and "install g++" in out
    out = run_dropin(folder, tmp_path, os.environ["PATH"])  # a compiler: built from source, into the user's cache
    assert "kernel_calls 1" in out and "does not have the sha256 recorded" in out
    assert len(list((tmp_path / "cache").glob("*/kernel.so"))) == 1


def test_the_shipped_arch_fits_this_host_or_a_newer_one(tmp_path):
    mod = load(write_folder(tmp_path / "out", KERNEL, SPEC2), "dropin_arch")
    assert mod._host_arch() == build.cpu_level()  # the drop-in and the runner name this CPU alike
    assert mod._fits("x86-64-v2", "x86-64-v3") and not mod._fits("x86-64-v4", "x86-64-v3")
    assert mod._fits("aarch64", "aarch64") and not mod._fits("x86-64", "aarch64")
    mod.BACKEND = "cuda"
    assert mod._fits("sm_80", "sm_90") and mod._fits("sm_90", "sm_100") and not mod._fits("sm_90", "sm_80")


class FakeLib:
    """A library asking for scratch memory the way the catalog's CUDA code does (fusebot_set_workspace)."""

    def __init__(self, need):
        self.need, self.given, self.calls = need, (None, 0), []
        self.fb_set_workspace = lambda ptr, n: setattr(self, "given", (ptr, n))
        self.fb_workspace_need = lambda: self.need
        self.fb_last_error = None

    def fusebot_forward(self, ins, n_in, outs, n_out, stream):
        ptr, n = self.given
        self.calls.append(n)
        return 0 if ptr and n >= self.need else 3


def test_scratch_memory_comes_from_torch_and_is_asked_for_once(tmp_path):
    mod = load(write_folder(tmp_path / "out", KERNEL, SPEC2), "dropin_ws")
    lib = FakeLib(4096)
    x, y = torch.randn(8), torch.empty(8)
    assert mod._launch(lib, [x], [y], None, x.device) == 0
    assert lib.calls == [0, 4096]  # refused without, then given what it asked for
    assert mod._launch(lib, [x], [y], None, x.device) == 0
    assert lib.calls == [0, 4096, 4096]  # remembered for these shapes
    plain = type("Plain", (), {"fb_set_workspace": None, "fb_workspace_need": None,
                               "fusebot_forward": staticmethod(lambda *a: 0)})()
    assert mod._launch(plain, [x], [y], None, x.device) == 0  # a library without it: called as before


def test_the_library_exports_are_bound_where_present(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    mod = load(write_folder(tmp_path / "out", KERNEL, SPEC2), "dropin_bind")
    lib = mod._bind(mod._compile())
    assert lib.fb_last_error is None and lib.fb_set_workspace is None  # this kernel exports neither
    assert isinstance(lib.fusebot_forward, ctypes._CFuncPtr)
    _, fused = pair(mod)
    with torch.no_grad():
        fused(torch.randn(64, 256))
    assert mod.Model.kernel_calls == 1


@pytest.mark.skipif(not hasattr(os, "memfd_create"), reason="memfd_create is Linux's")
def test_a_shipped_library_is_loaded_from_memory(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    mod = load(write_folder(tmp_path / "out", KERNEL, SPEC2, ship=True), "dropin_memfd")
    lib = mod._library(torch.device("cpu"))
    assert lib._name.startswith("/proc/self/fd/") and not (tmp_path / "cache").exists()


def test_building_for_another_gpu_says_so_naming_the_test_beside_it(tmp_path, monkeypatch, caplog):
    from runner.harness.dropin import dropin_source

    folder = write_folder(tmp_path / "out", KERNEL, SPEC2)
    (folder / "dropin.py").write_text(dropin_source(SPEC2, "cuda", built_for="NVIDIA H100 80GB HBM3",
                                                    built_arch="sm_90"))
    (folder / "kernel.cu").write_text("// not built here\n")
    (folder / "test_dropin.py").rename(folder / "test_scale_relu.py")  # the name a PR gives it
    mod = load(folder, "dropin_other_gpu")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA A100")
    monkeypatch.setattr(mod, "_nvcc", lambda: None)
    for capability, warned in (((9, 0), False), ((8, 0), True)):
        monkeypatch.setattr(torch.cuda, "get_device_capability", lambda device=None, c=capability: c)
        caplog.clear()
        with pytest.raises(mod.BuildError, match="nvcc was not found"):
            mod._compile(torch.device("cuda", 0))
        said = [r.getMessage() for r in caplog.records if "verified on" in r.getMessage()]
        assert bool(said) == warned, said
    assert "building kernel.cu for sm_80 (NVIDIA A100)" in said[0] and "NVIDIA H100 80GB HBM3 (sm_90)" in said[0]
    assert "run test_scale_relu.py" in said[0]


def test_two_shipped_libraries_in_one_process_stay_apart(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    right = load(write_folder(tmp_path / "a", KERNEL, SPEC2, ship=True), "dropin_two_a")
    other = KERNEL.replace("v < 0.0f ? 0.0f : v", "v")  # no ReLU: results tell the libraries apart
    plain = load(write_folder(tmp_path / "b", other, SPEC2, ship=True), "dropin_two_b")
    x = torch.randn(64, 256)
    outs = []
    for mod in (right, plain, right):
        mod._BY_DEVICE.clear()
        mod._LIBS.clear()  # loaded again: the fd numbers of closed memfds would have come back
        original, fused = pair(mod)
        with torch.no_grad():
            outs.append((fused(x), original(x)))
    torch.testing.assert_close(*outs[0])
    torch.testing.assert_close(*outs[2])
    assert (outs[1][0] < 0).any()  # the second library's own (wrong) kernel ran, not the first's
