"""The drop-in's forward where PyTorch takes a module apart: copies and pickles (no registry of modules), jit.trace,
jit.script, fx.symbolic_trace and vmap (the original forward), torch.compile (the custom op); CUDA: test_dropin_cuda.py."""

from __future__ import annotations

import copy
import gc
import importlib
import subprocess
import sys

import pytest
import torch

from tests.runner.harness.test_dropin import KERNEL, SPEC2, load, pair, write_folder


@pytest.fixture
def pkg(tmp_path, monkeypatch):
    """The drop-in importable as `fbk.scale_relu.dropin` (as a PR's kernels package is), its library shipped."""
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    root = tmp_path / "repo"
    folder = write_folder(root / "fbk" / "scale_relu", KERNEL, SPEC2, ship=True)
    (root / "fbk" / "__init__.py").write_text("")
    (folder / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(root))
    for name in [m for m in sys.modules if m == "fbk" or m.startswith("fbk.")]:
        monkeypatch.delitem(sys.modules, name)
    mod = importlib.import_module("fbk.scale_relu.dropin")
    torch.manual_seed(0)
    original = mod.Original(256).eval()
    fused = mod.Model(256).eval()
    fused.load_state_dict(original.state_dict())
    return root, mod, original, fused


def test_a_deep_copy_outlives_the_original_and_a_pickle_loads_in_another_process(pkg, tmp_path):
    root, mod, original, fused = pkg
    x = torch.randn(64, 256)
    want = original(x).detach()
    twin = copy.deepcopy(fused)
    del fused
    gc.collect()
    with torch.no_grad():
        torch.testing.assert_close(twin(x), want)
    assert mod.Model.kernel_calls == 1
    torch.save(twin, tmp_path / "model.pt")
    torch.save((x, want), tmp_path / "data.pt")
    script = (
        "import sys, torch\n"
        f"m = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=False)\n"
        f"x, want = torch.load({str(tmp_path / 'data.pt')!r})\n"
        "with torch.no_grad():\n    torch.testing.assert_close(m(x), want)\n"
        "print(type(m).__module__, type(m).kernel_calls)\n"
    )
    done = subprocess.run([sys.executable, "-c", script], env={"PYTHONPATH": str(root), "PATH": "/nonexistent"},
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["fbk.scale_relu.dropin", "1"]


def test_jit_trace_script_fx_and_vmap_get_the_original_forward(pkg):
    _, mod, original, fused = pkg
    x = torch.randn(64, 256)
    want = original(x).detach()
    with torch.no_grad():
        traced = torch.jit.trace(fused, (x,), check_trace=False)
    assert "fusebot" not in str(traced.graph) and "relu" in str(traced.graph)
    scripted = torch.jit.script(fused)
    gm = torch.fx.symbolic_trace(fused)
    assert [n.name for n in gm.graph.nodes if n.op == "placeholder"] == ["x"]
    assert "relu" in gm.code and "fusebot" not in gm.code
    before = mod.Model.kernel_calls
    with torch.no_grad():
        for run in (traced, scripted, gm):
            torch.testing.assert_close(run(x), want)
        batched = torch.func.vmap(fused)(x.reshape(8, 8, 256))
    assert mod.Model.kernel_calls == before  # none of them ran the kernel
    torch.testing.assert_close(batched.reshape(64, 256), want)
    with torch.no_grad():
        fused(x)  # and the module itself still does
    assert mod.Model.kernel_calls == before + 1


@pytest.mark.slow
def test_torch_compile_calls_the_custom_op_and_the_graph_drops_the_originals_values(pkg):
    _, mod, original, fused = pkg
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    x = torch.randn(64, 256)
    want = original(x).detach()
    fused.requires_grad_(False)
    compiled = torch.compile(fused, backend=recording, fullgraph=True)
    before = mod.Model.kernel_calls
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), want)
    assert mod.Model.kernel_calls == before + 1
    ops = [n for n in graphs[-1].graph.nodes if n.op == "call_function" and mod.OP_NAME.split("::")[1] in str(n.target)]
    assert len(ops) == 1
    dead = [n for n in graphs[-1].graph.nodes if n.op == "call_function" and "relu" in str(n.target) and n not in ops]
    assert dead
    assert all(not n.users for n in dead)  # the original's values are not used: the compiler drops them
    inductor = torch.compile(fused, fullgraph=True)
    with torch.no_grad():
        torch.testing.assert_close(inductor(x), want)
        other = torch.randn(5, 256)  # not a verified shape: the compiled original
        torch.testing.assert_close(inductor(other), original(other).detach())
    assert mod.Model.kernel_calls == before + 2


def test_torch_compile_of_a_size_generic_kernel_takes_other_sizes(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    kernel = "// fused by fusebot's seed proposer: test\n" + KERNEL  # fusebot's own kernels read sizes from the call
    mod = load(write_folder(tmp_path / "out", kernel, SPEC2), f"dropin_cg_{tmp_path.name}")
    original, fused = pair(mod)
    fused.requires_grad_(False)
    assert mod._sizes() == {}
    compiled = torch.compile(fused, backend="eager", fullgraph=True)
    x = torch.randn(10, 256)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), original(x))
    assert mod.Model.kernel_calls == 1
    monkeypatch.setenv("FUSEBOT_DISABLE", "1")  # read when torch.compile traces: a fresh compile sees it
    torch._dynamo.reset()
    with torch.no_grad():
        torch.testing.assert_close(torch.compile(fused, backend="eager", fullgraph=True)(x), original(x))
    assert mod.Model.kernel_calls == 1
