"""The CUDA drop-in on a GPU (marked `gpu`): the device code shipped beside it (a catalog kernel's, the seed proposer's,
a hand-written launcher's) loading with no nvcc on PATH, scratch memory from torch's caching allocator (the recorded
workspace), several streams, a CUDA graph, torch.compile, and the device guard on a second GPU where there is one.
Making the device code and its plans needs no GPU: test_launch_plan.py."""

from __future__ import annotations

import copy
import importlib
import os
import pickle
import subprocess
import sys

import pytest
import torch

from runner.catalog.codegen.cuda.common import workspace_code
from runner.contract import Candidate, ProblemSpec
from runner.harness.dropin import HEADER_FILE, REFERENCE_FILE, dropin_files
from runner.results.dropin_test import dropin_test_source
from tests.runner.harness.test_dropin import ROOT
from tests.runner.harness.test_launch_plan import COLS, ROWS, call, catalog_kernel, seed_call
from tests.runner.harness.test_launch_plan import REFERENCE as ROWGAIN
from tests.verdicts import EXAMPLE, seed_candidate
from tests.verdicts import SPEC as EXAMPLE_SPEC

PATH = os.environ.get("PATH", os.defpath)  # as the session found it (the fixture below takes nvcc away)

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

REFERENCE = """import torch
import torch.nn as nn


class Model(nn.Module):
    def forward(self, x):
        return x * 2.0 + 1.0


def get_inputs():
    return [torch.randn(4096, 1024)]


def get_init_inputs():
    return []
"""

WS_CALL = {"inputs": [["float32", [4096, 1024]]], "outputs": [["float32", [4096, 1024]]]}

# two kernels meeting in a workspace, as the catalog's split and grid layouts do (its workspace_code)
KERNEL = """#include <cuda_runtime.h>
#include <stdio.h>
#include "fusebot.h"
static char fb_err[256];
FB_EXPORT const char* fusebot_last_error(void) { return fb_err; }
""" + workspace_code("float v;") + """
__global__ void fb_k1(const float* x, FbWs* ws, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) ws[i].v = x[i] * 2.0f;
}
__global__ void fb_k2(const FbWs* ws, float* y, long long n) {
  long long i = blockIdx.x * (long long)blockDim.x + threadIdx.x;
  if (i < n) y[i] = ws[i].v + 1.0f;
}
FB_EXPORT int fusebot_forward(const fb_tensor* in, int32_t n_in, fb_tensor* out, int32_t n_out, void* stream) {
  if (n_in != 1 || n_out != 1) { snprintf(fb_err, sizeof fb_err, "expected one input and one output"); return 1; }
  long long n = 1;
  for (int d = 0; d < in[0].ndim; ++d) n *= in[0].shape[d];
  cudaStream_t s = (cudaStream_t)stream;
  FbWs* ws = (FbWs*)fb_workspace((size_t)n * sizeof(FbWs), s);
  if (!ws) { snprintf(fb_err, sizeof fb_err, "workspace allocation failed"); return 3; }
  const unsigned blocks = (unsigned)((n + 255) / 256);
  fb_k1<<<blocks, 256, 0, s>>>((const float*)in[0].data, ws, n);
  fb_k2<<<blocks, 256, 0, s>>>(ws, (float*)out[0].data, n);
  return cudaGetLastError() == cudaSuccess ? 0 : 4;
}
"""


@pytest.fixture
def ws_dropin(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "repo" / "fbk_ws" / "twice"
    folder.mkdir(parents=True)
    (folder / "kernel.cu").write_text(KERNEL)
    (folder / HEADER_FILE).write_text((ROOT / "runner/csrc/fusebot.h").read_text())
    (folder / REFERENCE_FILE).write_text(REFERENCE)
    (folder / "reference_src.py").write_text(REFERENCE)
    spec = ProblemSpec(name="twice", path=str(folder / "reference_src.py"))
    files = dropin_files(spec, Candidate(id="ws", format="fast", backend="cuda", sources={"kernel.cu": KERNEL}),
                         calls=[WS_CALL])
    assert any(n.endswith(".cubin.b64") for n in files), "the runner made no device code"
    assert not any(".so" in n for n in files), sorted(files)  # its author's launcher ships as launch plans
    for name, text in files.items():
        (folder / name).write_text(text)
    for pkg in (folder.parent, folder):
        (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "repo"))
    monkeypatch.setenv("PATH", "/nonexistent")  # the shipped device code: no nvcc needed
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    yield importlib.import_module("fbk_ws.twice.dropin")
    for name in [m for m in sys.modules if m.startswith("fbk_ws")]:
        sys.modules.pop(name)


def test_scratch_memory_streams_graphs_and_compile(ws_dropin, tmp_path, monkeypatch):
    mod = ws_dropin
    fused = mod.Model().cuda().eval()
    x = torch.randn(4096, 1024, device="cuda")
    want = x * 2.0 + 1.0
    with torch.no_grad():
        torch.testing.assert_close(fused(x), want)
        assert mod.Model.kernel_calls == 1
        assert [p["workspace"] for p in mod.PLANS] == [4096 * 1024 * 4]  # recorded once, given by torch's allocator
        streams = [torch.cuda.Stream() for _ in range(4)]
        outs = []
        for k, s in enumerate(streams):
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                outs.append(fused(x + k))
        torch.cuda.synchronize()
        for k, o in enumerate(outs):
            torch.testing.assert_close(o, want + 2.0 * k)
        static = x.clone()
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            out = fused(static)
        static.copy_(x * 0.5)
        graph.replay()
        torch.cuda.synchronize()
        torch.testing.assert_close(out, x + 1.0)
        calls = mod.Model.kernel_calls
        monkeypatch.setenv("PATH", PATH)  # the device code is loaded; torch.compile's own builds need gcc and ld
        compiled = torch.compile(fused, fullgraph=True)
        torch.testing.assert_close(compiled(x), want)
        assert mod.Model.kernel_calls == calls + 1
    assert not (tmp_path / "cache").exists()  # nothing built here


@pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs a second GPU")
def test_a_module_on_the_second_gpu_runs_there_and_leaves_the_current_device(ws_dropin):
    fused = ws_dropin.Model().cuda().eval()
    torch.cuda.set_device(0)
    on1 = copy.deepcopy(fused).to("cuda:1")
    x = torch.randn(4096, 1024, device="cuda:1")
    with torch.no_grad():
        got = on1(x)
    assert got.device == torch.device("cuda:1") and torch.cuda.current_device() == 0
    assert ws_dropin.Model.kernel_calls == 1
    torch.testing.assert_close(got, x * 2.0 + 1.0)


def test_the_seed_kernel_runs_from_its_device_code_and_other_sizes_and_cpu_tensors_run_the_original(tmp_path,
                                                                                                   monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "repo"
    (root / "examples").mkdir(parents=True)
    (root / "examples" / "mlp_epilogue.py").write_text(EXAMPLE.read_text())
    folder = root / "fbk_seed" / "scaledbiasrelu"
    folder.mkdir(parents=True)
    cand = seed_candidate("cuda")
    (folder / "kernel.cu").write_text(cand.sources["kernel.cu"])
    (folder / HEADER_FILE).write_text((ROOT / "runner/csrc/fusebot.h").read_text())
    # the verified calls: the example's two declared shapes (the guard takes exactly those, each with its plan)
    files = dropin_files(EXAMPLE_SPEC, cand, root_depth=1, calls=[seed_call(256), seed_call(2 * 256 + 3)])
    assert any(n.endswith(".cubin.b64") for n in files) and not any(".so" in n for n in files), sorted(files)
    for name, text in files.items():
        (folder / name).write_text(text)
    for pkg in (folder.parent, folder):
        (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    monkeypatch.setenv("PATH", "/nonexistent")
    mod = importlib.import_module("fbk_seed.scaledbiasrelu.dropin")
    torch.manual_seed(0)
    original = mod.Original(4096).cuda().eval()
    fused = mod.ScaledBiasReLU(4096).cuda().eval()
    fused.load_state_dict(original.state_dict())
    x = torch.randn(256, 4096, device="cuda")
    second = torch.randn(515, 4096, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x))
        torch.testing.assert_close(fused(second), original(second))
        assert mod.ScaledBiasReLU.kernel_calls == 2
        other = torch.randn(300, 4096, device="cuda")  # not a verified size: the original forward
        torch.testing.assert_close(fused(other), original(other))
        assert mod.ScaledBiasReLU.kernel_calls == 2
        with pytest.warns(mod.FallbackWarning, match="the kernel runs on one cuda device"):
            cpu = copy.deepcopy(fused).cpu()(x.cpu())
        torch.testing.assert_close(cpu, original(x).cpu())
    assert mod.ScaledBiasReLU.kernel_calls == 2 and not (tmp_path / "cache").exists()
    for name in [m for m in sys.modules if m.startswith("fbk_seed") or m == "examples" or m.startswith("examples.")]:
        sys.modules.pop(name)


def _rowgain_device_files(folder):
    """RowGain's catalog kernel, its header and reference written into `folder`; the drop-in's files for them, its
    launch plan recorded at ROWS: (the problem, the files)."""
    folder.mkdir(parents=True)
    src = catalog_kernel(ROWGAIN)
    (folder / "kernel.cu").write_text(src)
    (folder / HEADER_FILE).write_text((ROOT / "runner/csrc/fusebot.h").read_text())
    (folder / REFERENCE_FILE).write_text(ROWGAIN)
    (folder / "reference_src.py").write_text(ROWGAIN)
    spec = ProblemSpec(name="rowgain", path=str(folder / "reference_src.py"))
    return spec, dropin_files(spec, Candidate(id="rg", format="fast", backend="cuda", sources={"kernel.cu": src}),
                              calls=[call(ROWS)])


def test_a_catalog_kernel_ships_device_code_only_and_runs_from_its_cubin(tmp_path, monkeypatch):
    """RowGain's catalog kernel: the drop-in ships its cubin, PTX and launch plans (no host library) and, with no nvcc
    on PATH, runs from the cubin through the CUDA driver at the verified shape, on torch's current stream, under
    CUDA graph capture and torch.compile, after deepcopy and pickle; FUSEBOT_DISABLE and another size run the
    original."""
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    folder = tmp_path / "repo" / "fbk_cubin" / "rowgain"
    spec, files = _rowgain_device_files(folder)
    assert any(n.endswith(".cubin.b64") for n in files) and any(n.endswith(".ptx") for n in files), sorted(files)
    assert not any(".so" in n for n in files), sorted(files)
    for name, text in files.items():
        (folder / name).write_text(text)
    for pkg in (folder.parent, folder):
        (pkg / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path / "repo"))
    monkeypatch.setenv("PATH", "/nonexistent")
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    mod = importlib.import_module("fbk_cubin.rowgain.dropin")
    try:
        torch.manual_seed(0)
        fused = mod.Model(ROWS).cuda().eval()
        x = torch.randn(ROWS, COLS, device="cuda")
        want = torch.diag(fused.gain) @ x
        with torch.no_grad():
            torch.testing.assert_close(fused(x), want)
            assert mod.Model.kernel_calls == 1 and mod._LIBS == {} and mod._LIB is None
            s = torch.cuda.Stream()
            s.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(s):
                on_s = fused(x + 1)
            torch.cuda.synchronize()
            torch.testing.assert_close(on_s, torch.diag(fused.gain) @ (x + 1))
            static = x.clone()
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                out = fused(static)
            static.copy_(x * 0.5)
            graph.replay()
            torch.cuda.synchronize()
            torch.testing.assert_close(out, torch.diag(fused.gain) @ (x * 0.5))
            for other in (copy.deepcopy(fused), pickle.loads(pickle.dumps(fused))):
                torch.testing.assert_close(other(x), want)
            calls = mod.Model.kernel_calls
            with pytest.warns(mod.FallbackWarning, match="shape"):
                y = torch.randn(ROWS, COLS // 2 + 3, device="cuda")
                torch.testing.assert_close(fused(y), torch.diag(fused.gain) @ y)
            monkeypatch.setenv("FUSEBOT_DISABLE", "1")
            torch.testing.assert_close(fused(x), want)
            assert mod.Model.kernel_calls == calls
            monkeypatch.delenv("FUSEBOT_DISABLE")
            monkeypatch.setenv("PATH", PATH)  # torch.compile's own builds need gcc and ld
            compiled = torch.compile(fused, fullgraph=True)
            torch.testing.assert_close(compiled(x), want)
            assert mod.Model.kernel_calls == calls + 1
        assert not (tmp_path / "cache").exists()  # nothing built on this host
    finally:
        for name in [m for m in sys.modules if m.startswith("fbk_cubin")]:
            sys.modules.pop(name)


def test_the_generated_test_passes_through_the_device_code_graph_capture_included(tmp_path):
    """The test a PR ships, run as the runner's check runs it (pytest in its own process, no nvcc on PATH) beside
    RowGain's catalog drop-in with device code only: every check passes, the CUDA graph's capture and replay among
    them, and nothing is built."""
    folder = tmp_path / "repo" / "rowgain"
    spec, files = _rowgain_device_files(folder)
    assert any(n.endswith(".cubin.b64") for n in files) and not any(".so" in n for n in files), sorted(files)
    for name, text in files.items():
        (folder / name).write_text(text)
    (folder / "test_rowgain.py").write_text(dropin_test_source(spec, "cuda"))
    env = {k: v for k, v in os.environ.items() if k not in ("PYTEST_ADDOPTS", "CUDA_HOME", "CUDA_PATH")} | {
        "PATH": "/usr/bin:/bin", "FUSEBOT_DROPIN_CACHE": str(tmp_path / "cache")}
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", "test_rowgain.py"],
                          cwd=folder, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-2000:]
    assert "PASSED test_rowgain.py::test_cuda_graph_capture_and_replay" in done.stdout, done.stdout[-4000:]
    assert "skipped" not in done.stdout and not (tmp_path / "cache").exists()
