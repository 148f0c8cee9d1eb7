"""The generated drop-in module and its generated test, run for real: g++ builds the kernel, ctypes calls it.
(Helpers here are shared by the other test_dropin_*.py modules.)"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runner.contract import Candidate, ProblemSpec
from runner.harness.dropin import HEADER_FILE, REFERENCE_FILE, dropin_files, dropin_source, kernel_filename
from runner.results.dropin_test import dropin_test_source

ROOT = Path(__file__).resolve().parents[3]
PROBLEM = ROOT / "tests/fixtures/problems/scale_relu.py"
KERNEL = (ROOT / "tests/fixtures/candidates/scale_relu_ok.cpp").read_text()
SPEC = ProblemSpec(name="scale_relu", path=str(PROBLEM))
SPEC2 = ProblemSpec(name="scale_relu", path=str(PROBLEM), second_inputs="get_second_inputs")  # (64|193, 256)


def write_folder(folder: Path, kernel: str, spec: ProblemSpec = SPEC, *, ship: bool = False,
                 reference: str | None = None) -> Path:
    """A drop-in's folder as a PR adds it (CPU backend); `ship`: with the library built here beside it."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / kernel_filename("cpu")).write_text(kernel)
    (folder / HEADER_FILE).write_text((ROOT / "runner/csrc/fusebot.h").read_text())
    (folder / REFERENCE_FILE).write_text(reference if reference is not None else PROBLEM.read_text())
    if ship:
        cand = Candidate(id="t", format="fast", backend="cpu", sources={"kernel.cpp": kernel})
        for name, text in dropin_files(spec, cand, "0123abcd" * 8).items():
            (folder / name).write_text(text)
    else:
        (folder / "dropin.py").write_text(dropin_source(spec, "cpu"))
    (folder / "test_dropin.py").write_text(dropin_test_source(spec, "cpu"))
    return folder


def load(folder: Path, name: str):
    spec = importlib.util.spec_from_file_location(name, folder / "dropin.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


def pair(mod, features: int = 256, seed: int = 0):
    torch.manual_seed(seed)
    original = mod.Original(features).eval()
    fused = mod.Model(features).eval()
    fused.load_state_dict(original.state_dict())
    return original, fused


def test_the_dropin_is_the_original_class_with_the_kernel_inside(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    mod = load(write_folder(tmp_path / "out", KERNEL, SPEC2), "dropin_ok")
    original, fused = pair(mod)
    assert isinstance(fused, mod.Original) and list(fused.state_dict()) == ["bias"]
    for rows in (64, 193):  # both declared shapes
        x = torch.randn(rows, 256)
        with torch.no_grad():
            torch.testing.assert_close(fused(x), original(x), atol=1e-5, rtol=1e-5)
    assert mod.Model.kernel_calls == 2
    assert len(list((tmp_path / "cache").glob("*/kernel.so"))) == 1  # nothing shipped: built from source, cached
    # autograd wanting gradients: the original forward (the kernel is for inference), the same gradients
    x = torch.randn(64, 256, requires_grad=True)
    y = fused(x)
    assert y.requires_grad and mod.Model.kernel_calls == 2
    y.sum().backward()
    xr = x.detach().clone().requires_grad_(True)
    original(xr).sum().backward()
    torch.testing.assert_close(x.grad, xr.grad)


def test_an_eager_call_skips_the_custom_op(tmp_path, monkeypatch):
    """The op's dispatch costs tens of microseconds a call (as much as a short kernel): an eager call runs the kernel
    directly; torch.compile gets the op (test_dropin_forward.py)."""
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    mod = load(write_folder(tmp_path / "out", KERNEL), "dropin_fast")
    through_op = []
    op = mod.fused
    monkeypatch.setattr(mod, "fused", lambda *a: through_op.append(1) or op(*a))
    original, fused = pair(mod)
    x = torch.randn(64, 256)
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x), atol=1e-5, rtol=1e-5)
    assert through_op == [] and mod.Model.kernel_calls == 1
    fused.requires_grad_(False)
    fused(x)  # grad mode, but nothing wants a gradient: the kernel
    assert mod.Model.kernel_calls == 2
    # the state is looked up where it lives at each call: a parameter replaced after construction is the one used
    with torch.no_grad():
        fused.bias = torch.nn.Parameter(fused.bias + 1.0, requires_grad=False)
        original.bias += 1.0
        torch.testing.assert_close(fused(x), original(x), atol=1e-5, rtol=1e-5)
    assert mod.Model.kernel_calls == 3


NESTED = """import torch
import torch.nn as nn


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.Sequential(nn.LayerNorm(8), nn.Linear(8, 8))
        self.register_buffer("shift", torch.ones(8))

    def forward(self, x):
        return self.ln(x) + self.shift


def get_inputs():
    return [torch.randn(2, 8)]


def get_init_inputs():
    return []
"""


def test_the_state_lookup_follows_nested_submodules_buffers_and_replacements(tmp_path):
    ref = tmp_path / "nested.py"
    ref.write_text(NESTED)
    spec = ProblemSpec(name="nested", path=str(ref))
    folder = write_folder(tmp_path / "out", KERNEL, spec)
    (folder / REFERENCE_FILE).write_text(NESTED)
    (folder / "dropin.py").write_text(dropin_source(spec, "cpu"))
    mod = load(folder, "dropin_nested")
    m = mod.Model()
    want = list(m.state_dict(keep_vars=True).values())
    assert len(want) == 5 and all(a is b for a, b in zip(m._fusebot_state(), want, strict=True))
    m.ln[1] = torch.nn.Linear(8, 8)  # a replaced submodule's tensors, not the old ones
    now = dict(zip(m._fusebot_state_names, m._fusebot_state(), strict=True))
    assert now["ln.1.weight"] is m.ln[1].weight and now["ln.1.bias"] is m.ln[1].bias and now["shift"] is m.shift


@pytest.mark.parametrize("shape, strides", [((), ()), ((7,), (1,)), ((2, 3, 4), (1, 2, 6)), ((1,) * 8, (1,) * 8)])
def test_the_packed_tensor_descriptors_are_the_abi_structs_field_by_field(tmp_path, shape, strides):
    mod = load(write_folder(tmp_path / "out", KERNEL), f"dropin_pack_{len(shape)}")
    base = torch.zeros(64, dtype=torch.float16)
    t = torch.as_strided(base, shape, strides)
    arr = mod._describe_all([t, base])
    assert len(arr) == 2 and len(mod._describe_all([])) == 1  # (the ABI's arrays are never empty)
    d = arr[0]
    assert (d.data, d.dtype, d.ndim) == (t.data_ptr(), 1, len(shape))
    assert list(d.shape) == [*shape, *[0] * (8 - len(shape))] and list(d.strides) == [*strides, *[0] * (8 - len(shape))]
    assert (arr[1].ndim, arr[1].shape[0], arr[1].strides[0], arr[1].shape[1]) == (1, 64, 1, 0)


def test_the_generated_test_passes_for_a_right_kernel_and_fails_for_a_wrong_one(tmp_path):
    env = {"FUSEBOT_DROPIN_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    ok = write_folder(tmp_path / "ok", KERNEL, ship=True)
    bad = write_folder(tmp_path / "bad", KERNEL.replace("v < 0.0f ? 0.0f : v", "v"), ship=True)  # forgot the ReLU
    run = lambda d: subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(d)],  # noqa: E731
                                   cwd=d, env=env, capture_output=True, text=True, timeout=300)
    good = run(ok)
    assert good.returncode == 0, good.stdout + good.stderr
    assert "5 passed" in good.stdout  # class, guard and switches; 3 seeds; gradients (one declared shape)
    wrong = run(bad)
    assert wrong.returncode == 1 and "3 failed, 2 passed" in wrong.stdout  # (gradients: the original's)
    assert not (tmp_path / "cache").exists()  # the shipped library ran: nothing was built


def test_a_cuda_dropin_test_is_skipped_without_a_gpu():
    src = dropin_test_source(SPEC, "cuda")
    assert 'pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available()' in src and "DEVICE = 'cuda'" in src
    assert "nvcc" in dropin_source(SPEC, "cuda") and "kernel.cu" in dropin_source(SPEC, "cuda")
    assert "test_dropin.py" not in dropin_source(SPEC, "cuda")  # it names the test found beside it


@pytest.mark.parametrize("backend", ["cpu", "cuda"])
def test_generated_sources_are_valid_python(backend):
    compile(dropin_source(SPEC, backend), "dropin.py", "exec")
    compile(dropin_test_source(SPEC, backend), "test_dropin.py", "exec")
    repo = ProblemSpec(name="gelu", module="mypkg.layers", class_name="NewGELU", inputs="mypkg.inputs:make",
                       init_inputs=None, init_args=[3], dtype="float16")
    assert "importlib.import_module('mypkg.layers')" in dropin_source(repo, backend)
    t = dropin_test_source(repo, backend)
    compile(t, "t.py", "exec")
    assert "INIT_ARGS = [3]" in t and "DTYPE_NAME = 'float16'" in t and "ATOL = None" in t and "'float16': (0.01, 0.01)" in t
