"""The files of a result and the generated drop-in, run for real on the CPU backend: g++ builds the seed proposer's
fused kernel, the drop-in calls it through its torch.library custom op; checkpoints, torch.compile and autograd go
through it; the runner's own check of the generated test accepts a right kernel and refuses a wrong one."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import sys
from pathlib import Path

import pytest
import torch

from runner.contract import Candidate
from runner.harness.build import cpu_level
from runner.results.files import (
    Provenance,
    check_dropin,
    dropin_test_filename,
    slug,
    target_files,
    target_result,
    write_files,
)
from runner.results.proposal import Fallback
from runner.search.types import Attempt
from tests.verdicts import EXAMPLE, SPEC, real_verdicts, seed_candidate

KERNELS = "fusebot_kernels"
PROV = Provenance(target=SPEC.name, repo="acme/models", commit="0123456789abcdef", device="AMD EPYC (test)",
                  date="2026-11-21T18:00:00+00:00", fusebot="0.1.0")


def make_repo(tmp: Path) -> Path:
    repo = tmp / "repo"
    (repo / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, repo / "examples" / EXAMPLE.name)
    return repo


def load_dropin(repo: Path, name: str):
    folder = repo / KERNELS / slug(SPEC.name)
    spec = importlib.util.spec_from_file_location(name, folder / "dropin.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    return mod


@pytest.fixture
def dropin_repo(tmp_path, monkeypatch):
    """A repository with the example module and the fused kernel's files; the drop-in loaded from it."""
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    repo = make_repo(tmp_path)
    files = target_files(SPEC, seed_candidate(), real_verdicts()["fused"], PROV, kernels_dir=KERNELS)
    write_files(repo / KERNELS, files)
    monkeypatch.syspath_prepend(str(repo))
    for name in [m for m in sys.modules if m == "examples" or m.startswith("examples.")]:
        monkeypatch.delitem(sys.modules, name)
    return repo, files, load_dropin(repo, f"dropin_{tmp_path.name}")


def test_files_carry_provenance_and_the_verdicts_numbers(dropin_repo):
    _, files, _ = dropin_repo
    folder = slug(SPEC.name)
    names = ("kernel.cpp", "fusebot.h", "dropin.py", "BENCHMARK.md", dropin_test_filename(SPEC.name), "__init__.py",
             "fusebot.json", f"bench_{folder}.py", f"kernel.{cpu_level()}.so.b64")  # (the shipped library)
    assert sorted(files) == sorted([f"{folder}/{n}" for n in names] + ["__init__.py"])
    kernel = files[f"{folder}/kernel.cpp"]
    head = kernel.split("\n\n", 1)[0]
    for fact in (SPEC.name, PROV.repo, PROV.commit, PROV.device, PROV.date, PROV.fusebot):
        assert fact in head
    assert seed_candidate().sources["kernel.cpp"] in kernel
    v = real_verdicts()["fused"]
    bench = files[f"{folder}/BENCHMARK.md"]
    for t in (v.timing, v.baselines.eager, v.baselines.compile):
        assert f"| {t.median_ms:.4g} | {t.iqr_ms:.3g} | {t.n} |" in bench
    assert f"{v.baselines.eager.median_ms / v.timing.median_ms:.2f}x" in bench
    assert f"{sum(t.passed for t in v.trials)} of {len(v.trials)} trials passed" in bench
    assert v.environment.torch in bench


def test_dropin_keeps_state_dict_keys_and_loads_the_originals_checkpoint(dropin_repo, tmp_path):
    _, _, mod = dropin_repo
    torch.manual_seed(3)
    original = mod.Original(512)
    with torch.no_grad():
        original.scale.fill_(1.7)  # a checkpoint whose values differ from a fresh module's
    torch.save(original.state_dict(), tmp_path / "ckpt.pt")
    fused = mod.ScaledBiasReLU(512)
    assert list(fused.state_dict()) == list(original.state_dict()) == ["scale", "bias"]
    fused.load_state_dict(torch.load(tmp_path / "ckpt.pt"))
    x = torch.randn(9, 512)
    before = mod.ScaledBiasReLU.kernel_calls
    with torch.no_grad():
        torch.testing.assert_close(fused(x), original(x))
    assert mod.ScaledBiasReLU.kernel_calls == before + 1
    assert isinstance(fused, mod.Original)
    assert not (tmp_path / "cache").exists()  # the shipped library ran: nothing built


def test_autograd_through_the_dropin_matches_the_original(dropin_repo):
    _, _, mod = dropin_repo
    torch.manual_seed(0)
    original = mod.Original(512)
    fused = mod.ScaledBiasReLU(512)
    fused.load_state_dict(original.state_dict())
    x = torch.randn(6, 512)
    weight = torch.randn(6, 512)
    grads = []
    for model in (original, fused):
        xi = x.clone().requires_grad_(True)
        (model(xi) * weight).sum().backward()
        grads.append((xi.grad, model.scale.grad, model.bias.grad))
    calls = mod.ScaledBiasReLU.kernel_calls
    assert calls == 0  # autograd wanting gradients: the original forward (the kernel is for inference)
    for got, want in zip(grads[1], grads[0], strict=True):
        assert got is not None and want is not None
        torch.testing.assert_close(got, want)
    assert grads[0][1].abs().item() > 0  # the gradient compared is not trivially zero


@pytest.mark.slow
def test_torch_compile_goes_through_the_custom_op(dropin_repo):
    _, _, mod = dropin_repo
    torch.manual_seed(1)
    original = mod.Original(512)
    fused = mod.ScaledBiasReLU(512)
    fused.load_state_dict(original.state_dict())
    graphs = []

    def recording(gm, example_inputs):
        graphs.append(str(gm.graph))
        return gm.forward

    compiled = torch.compile(fused, backend=recording, fullgraph=True)
    x = torch.randn(17, 512)
    before = mod.ScaledBiasReLU.kernel_calls
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), original(x))
    assert mod.ScaledBiasReLU.kernel_calls == before + 1
    assert any(mod.OP_NAME.split("::")[1] in g for g in graphs), graphs  # one opaque op in the graph
    inductor = torch.compile(fused, fullgraph=True)  # the real compiler, with the fake impl giving shapes
    with torch.no_grad():
        torch.testing.assert_close(inductor(x), original(x))


def test_runner_check_accepts_the_generated_test_and_refuses_a_wrong_kernel(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    v = real_verdicts()["fused"]
    good_root = make_repo(tmp_path / "good")
    good = target_result(SPEC, True, "faster", seed_candidate(), v, PROV, "trace", root=good_root,
                         kernels_dir=KERNELS, file="examples/mlp_epilogue.py")
    assert good.improved and good.dropin_check.passed, good.dropin_check.output_tail
    shapes, seeds = 2, 3
    assert good.dropin_check.passed_tests == 1 + shapes * seeds + shapes
    assert "Drop-in check before this was proposed" in good.files[f"{slug(SPEC.name)}/BENCHMARK.md"]
    # the PR adopts the drop-in in the module's own file; the check ran with that edit, and the copy is put back
    edit = good.files["/examples/mlp_epilogue.py"]
    assert edit.endswith("ScaledBiasReLU = _fusebot_adopt(ScaledBiasReLU)\n")
    assert (good_root / "examples/mlp_epilogue.py").read_text() == EXAMPLE.read_text()
    cand = seed_candidate()
    forgot_relu = cand.sources["kernel.cpp"].replace("yr[c] = fb_relu(", "yr[c] = (")
    wrong = cand.model_copy(update={"sources": {"kernel.cpp": forgot_relu}})
    bad = target_result(SPEC, True, "faster", wrong, v, PROV, "trace", root=make_repo(tmp_path / "bad"),
                        kernels_dir=KERNELS)
    assert not bad.improved and not bad.files and not bad.dropin_check.passed
    assert bad.dropin_check.failed_tests > 0 and "failed its own test" in bad.message


def test_a_kernel_that_fails_its_own_test_gives_way_to_the_rewrite_that_cleared_its_margin(tmp_path, monkeypatch):
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    v = real_verdicts()["fused"]
    cand = seed_candidate()
    wrong = cand.model_copy(update={"sources": {"kernel.cpp": cand.sources["kernel.cpp"].replace(
        "yr[c] = fb_relu(", "yr[c] = (")}})
    text = EXAMPLE.read_text()
    new_text = text.replace("return torch.relu(x * self.scale + self.bias)",
                            "return (x * self.scale + self.bias).clamp_min(0)")
    assert new_text != text
    rewrite = Attempt(round=1, proposer="rewrite", idea="clamp", verdict=v, candidate=Candidate(
        id="w", format="kernelbench", backend="cpu", sources={"model_new.py": new_text}, rewrite=new_text))
    root = make_repo(tmp_path)
    r = target_result(SPEC, True, "the kernel's claim", wrong, v, PROV, "trace", root=root, kernels_dir=KERNELS,
                      file="examples/mlp_epilogue.py", rewrite=rewrite,
                      fallback=Fallback("the rewrite's claim", 0.05))
    assert r.improved and r.message.startswith("the rewrite's claim; the kernel was verified by the harness but its "
                                               "generated drop-in failed its own test"), r.message
    assert r.message.endswith("the PyTorch rewrite, which cleared its own margin, is proposed instead")
    assert r.files["/examples/mlp_epilogue.py"] == new_text and r.dropin_check.passed
    assert not any(rel.endswith((".cpp", "dropin.py")) for rel in r.files), sorted(r.files)
    assert not (root / KERNELS / slug(SPEC.name) / "kernel.cpp").exists()  # the failed kernel's files are gone
    manifest = json.loads(r.files[f"{slug(SPEC.name)}/fusebot.json"])
    assert manifest["change"] == "rewrite" and manifest["margin"] == 0.05


def test_a_cuda_dropin_without_a_gpu_says_why_and_its_check_verifies_nothing(tmp_path, monkeypatch):
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    monkeypatch.setenv("FUSEBOT_DROPIN_CACHE", str(tmp_path / "cache"))
    repo = make_repo(tmp_path)
    cuda: Candidate = seed_candidate("cuda")
    write_files(repo / KERNELS, target_files(SPEC, cuda, real_verdicts()["fused"], PROV, kernels_dir=KERNELS))
    check = check_dropin(repo, KERNELS, SPEC.name)
    assert not check.passed and check.skipped_tests > 0 and "ran nothing" in check.reasons[0]
    monkeypatch.syspath_prepend(str(repo))
    mod = load_dropin(repo, f"dropin_cuda_{tmp_path.name}")
    with pytest.warns(mod.FallbackWarning, match="the kernel runs on one cuda device"), torch.no_grad():
        mod.ScaledBiasReLU(512)(torch.randn(2, 512))  # the original forward


def test_the_generated_test_runs_confined(tmp_path):
    """It imports the repository's code: no credentials, no writes outside its scratch copy."""
    from runner.results.files import check_dropin, dropin_test_filename, slug

    root, outside = tmp_path / "scratch", tmp_path / "outside.txt"
    folder = root / "fusebot_kernels" / slug("t")
    folder.mkdir(parents=True)
    (folder / dropin_test_filename("t")).write_text(
        "import os, pathlib, pytest\n\n"
        "def test_confined():\n"
        "    assert 'FUSEBOT_WORKER_TOKEN' not in os.environ\n"
        f"    with pytest.raises(PermissionError):\n        pathlib.Path({str(outside)!r}).write_text('x')\n"
    )
    env = {**os.environ, "FUSEBOT_WORKER_TOKEN": "t" * 32}
    check = check_dropin(root, "fusebot_kernels", "t", env=env)
    assert check.passed, check.output_tail
    assert not outside.exists()

