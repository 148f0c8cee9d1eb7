"""The bench script a PR ships: generated beside the drop-in, run for real (CPU backend: g++ builds the kernel, the
drop-in calls it) with nothing of fusebot importable, every contestant timed in alternating rounds with its raw
samples; its JSON read back as the harness's types."""

from __future__ import annotations

import json
import os
import runpy
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from runner.contract import Verdict
from runner.results.bench_script import bench_filename, bench_source, read_figures
from runner.results.files import Provenance, slug, target_files, write_files
from runner.results.proposal import unified_diff
from tests.verdicts import EXAMPLE, SPEC, seed_candidate

KERNELS = "fusebot_kernels"
FOLDER = slug(SPEC.name)
# Runs the script with fusebot's own packages made unimportable: the script must need nothing but torch.
NO_FUSEBOT = ("import runpy, sys; sys.modules['runner'] = None; sys.modules['bot'] = None; "
              "sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def repo_with_kernel(tmp_path: Path, backend: str = "cpu") -> Path:
    root = tmp_path / "repo"
    (root / "examples").mkdir(parents=True)
    shutil.copy(EXAMPLE, root / "examples" / EXAMPLE.name)
    v = Verdict(candidate_id="fused", problem=SPEC.name, accepted=True)
    write_files(root / KERNELS, target_files(SPEC, seed_candidate(backend), v, Provenance.for_verdict(SPEC.name, v),
                                             kernels_dir=KERNELS))
    return root


def run_script(root: Path, tmp_path: Path, *args: str) -> tuple[subprocess.CompletedProcess, dict]:
    out = tmp_path / "figures.json"
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {
        "FUSEBOT_DROPIN_CACHE": str(tmp_path / "cache"), "OMP_NUM_THREADS": "1",
        "TORCHINDUCTOR_CACHE_DIR": str(tmp_path / "inductor")}
    script = f"{KERNELS}/{FOLDER}/{bench_filename(FOLDER)}"
    done = subprocess.run([sys.executable, "-c", NO_FUSEBOT, script, "--json", str(out), *args], cwd=root, env=env,
                          capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr
    return done, json.loads(out.read_text())


def test_the_script_times_the_original_against_the_dropin_in_rounds_with_only_torch(tmp_path):
    root = repo_with_kernel(tmp_path)
    done, data = run_script(root, tmp_path, "--rounds", "2", "--threads", "1")
    c = data["contestants"]
    assert set(c) == {"PyTorch eager", "torch.compile", "fusebot"} and data["rounds"] == 2
    for f in c.values():
        assert len(f["round_medians_ms"]) == 2 and f["n"] == len(f["samples_ms"]) >= 20  # 10 calls a round at least
        assert all(x > 0 for x in f["samples_ms"])
    assert data["backend"] == "cpu" and data["threads"] == 1
    assert "fusebot over the faster baseline:" in done.stdout and "per round" in done.stdout
    head = done.stdout.splitlines()[0]  # the summary line names the threads and the timed shape
    assert "1 CPU thread(s)" in head and "timed on (256, 4096) float32" in head and data["shape"] in head
    for f in c.values():  # a user's call: a loop of calls back to back, once a round
        assert len(f["back_to_back_ms"]) == 2 and all(x > 0 for x in f["back_to_back_ms"])
    assert "a user's call back to back (50 calls, host path included)" in done.stdout
    assert "The PR's figure: not found in fusebot.json" in done.stdout and data["stated"] is None  # none was timed
    assert ("this host is too noisy" in done.stdout) == bool(data["noise"])  # said whenever the host is noisy
    timing, baselines, conf = read_figures(data)
    assert timing.samples_ms == c["fusebot"]["samples_ms"] and timing.clock == "monotonic"
    assert timing.back_to_back_ms == pytest.approx(sum(c["fusebot"]["back_to_back_ms"]) / 2)  # the median of two
    assert baselines.compile.n == c["torch.compile"]["n"] and conf.rounds == 2
    assert conf.speedup_vs_faster() == pytest.approx([min(e, k) / f for e, k, f in zip(
        c["PyTorch eager"]["round_medians_ms"], c["torch.compile"]["round_medians_ms"],
        c["fusebot"]["round_medians_ms"], strict=True)])


def test_the_script_is_generated_for_each_backend_and_kind():
    cuda = bench_source(SPEC, backend="cuda", target_folder=FOLDER, kernels_dir=KERNELS)
    cpu = bench_source(SPEC, backend="cpu", target_folder=FOLDER, kernels_dir=KERNELS)
    rewrite = bench_source(SPEC, backend="cpu", target_folder=FOLDER, kernels_dir=KERNELS, kind="rewrite",
                           module_file="examples/mlp_epilogue.py", commit="abc123")
    for text in (cuda, cpu, rewrite):
        compile(text, "bench.py", "exec")
        imported = {line.split()[1].split(".")[0] for line in text.splitlines()
                    if line.startswith(("import ", "from "))}
        assert imported <= {"argparse", "importlib", "json", "os", "re", "statistics", "subprocess", "sys", "time",
                            "types", "pathlib", "torch"}, imported
        assert "STRICT = True" in text or "KIND = 'rewrite'" in text  # a kernel's timed calls never fall back
    assert "BACKEND = 'cuda'" in cuda and "CUDA events" in cuda and "BACKEND = 'cpu'" in cpu
    assert f"python {KERNELS}/{FOLDER}/bench_{FOLDER}.py" in cpu
    assert "KIND = 'rewrite'" in rewrite and "COMMIT = 'abc123'" in rewrite and "LABEL = 'PyTorch rewrite'" in rewrite


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU")
def test_the_script_times_a_cuda_kernel_with_events(tmp_path):
    root = repo_with_kernel(tmp_path, backend="cuda")
    _, data = run_script(root, tmp_path, "--rounds", "3")
    assert data["backend"] == "cuda" and data["device"] == torch.cuda.get_device_name()
    timing, _, conf = read_figures(data)
    assert timing.clock == "cuda_events" and conf.rounds == 3 and timing.n >= 30


BEFORE = "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n        y = x * 2\n" \
         "        return torch.relu(y) + 1\n\n\ndef get_inputs():\n    return [torch.randn(4)]"  # no final newline
AFTER = "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n" \
        "        return torch.relu(x * 2) + 1\n\n\ndef get_inputs():\n    return [torch.randn(4)]\n"


@pytest.mark.parametrize("edited", [False, True])
def test_without_git_a_rewrites_script_takes_the_diff_back_from_the_module(tmp_path, edited):
    """A runner's copy of the branch has no .git: the module as it was is the module as it is, the manifest's diff
    taken back; a module edited where the rewrite changed it is refused, never timed against a wrong original."""
    root = tmp_path / "copy"
    (root / "pkg").mkdir(parents=True)
    (root / "pkg" / "m.py").write_text(AFTER.replace("x * 2", "x * 3") if edited else "# a comment\n" + AFTER)
    folder = root / KERNELS / "m"
    folder.mkdir(parents=True)
    (folder / "fusebot.json").write_text(json.dumps({"kind": "rewrite", "diff": unified_diff("pkg/m.py", BEFORE,
                                                                                             AFTER)}))
    script = folder / "bench_m.py"
    script.write_text(bench_source(SPEC, backend="cpu", target_folder="m", kernels_dir=KERNELS, kind="rewrite",
                                   module_file="pkg/m.py", commit="abc123"))
    probe = ("import runpy, sys; g = runpy.run_path(sys.argv[1]); root, text = g['_source_as_it_was'](); "
             "sys.stdout.write(text)")
    env = {k: v for k, v in os.environ.items() if not k.startswith("GIT_")} | {"GIT_CEILING_DIRECTORIES": str(tmp_path)}
    p = subprocess.run([sys.executable, "-c", probe, str(script)], cwd=root, env=env, capture_output=True, text=True)
    if edited:
        assert p.returncode != 0 and "changed where fusebot's rewrite did" in p.stderr
    else:
        assert p.returncode == 0, p.stderr
        assert p.stdout == "# a comment\n" + BEFORE  # the edit above the rewrite kept, the rewrite taken back


def script_functions(tmp_path: Path, manifest: dict | None) -> dict:
    """The generated script's functions, loaded (not run) from a folder holding `manifest` as its fusebot.json."""
    folder = tmp_path / "k" / "m"
    folder.mkdir(parents=True)
    if manifest is not None:
        (folder / "fusebot.json").write_text(json.dumps(manifest))
    (folder / "bench_m.py").write_text(bench_source(SPEC, backend="cuda", target_folder="m", kernels_dir="k"))
    return runpy.run_path(str(folder / "bench_m.py"))


def _timed(ms: float, b2b: float | None = None) -> dict:
    return {"median_ms": ms, "iqr_ms": ms / 100, "n": 100, "clock": "cuda_events"} | (
        {"back_to_back_ms": b2b} if b2b else {})


MANIFEST = {"timings": {"PyTorch eager": _timed(0.0385, 0.0385), "torch.compile": _timed(0.0378, 0.0606),
                        "fusebot": _timed(0.0054, 0.0304)},
            "rounds_vs_faster": [6.5, 7.0, 7.3], "margin": 0.05, "verified": {"device": "NVIDIA H200"}}


def test_the_script_reads_the_prs_own_figure_from_the_manifest_beside_it(tmp_path):
    claim = script_functions(tmp_path, MANIFEST)["stated"]()
    assert claim["speedup"] == pytest.approx(0.0378 / 0.0054) and (claim["low"], claim["high"]) == (6.5, 7.3)
    assert claim["rounds"] == 3 and claim["margin"] == 0.05 and claim["device"] == "NVIDIA H200"
    assert claim["user_speedup"] == pytest.approx(0.0385 / 0.0304)  # the faster baseline back to back is eager
    assert script_functions(tmp_path / "none", None)["stated"]() is None


def test_the_script_says_within_outside_or_not_comparable_beside_the_prs_figure(tmp_path):
    g = script_functions(tmp_path, MANIFEST)
    claim, judge, noise = g["stated"](), g["judge"], g["noise"]
    quiet = {"fusebot": {"median_ms": 0.0054, "iqr_ms": 0.0002}, "PyTorch eager": {"median_ms": 0.0385, "iqr_ms": 0.001}}
    assert noise(quiet, [6.9, 7.0, 7.1], load=0.5, cpus=16) == ""
    assert judge(claim, 7.0, [6.9, 7.0, 7.1], "").endswith("here 7.00x: within the PR's stated spread")
    assert "the PR states 7.00x (6.50-7.30x over 3 rounds, margin 5%) on NVIDIA H200" in judge(claim, 7.0, [7.0], "")
    assert "OUTSIDE the PR's stated spread (6.19-7.67x) on a quiet host" in judge(claim, 4.87, [4.8, 4.9], "")
    # a loaded host: 4.87x against the stated 7x is no evidence either way, and the script says so
    loud = {"fusebot": {"median_ms": 0.0054, "iqr_ms": 0.003}, "PyTorch eager": {"median_ms": 0.0385, "iqr_ms": 0.001}}
    why = noise(loud, [2.0, 4.87, 9.0], load=3.2, cpus=2)
    assert why == ("fusebot's calls spread 56% (IQR over median); the rounds' speedups spread 350% (2.00-9.00x); "
                   "a load average of 3.2 on 2 CPUs")
    # one preempted round of five moves the extremes, not the comparison, as in the harness's own rounds
    assert noise(quiet, [1.04, 1.03, 1.05, 1.14, 0.99]) == ""
    assert noise(quiet, [1.04, 1.03, 1.18, 1.14, 0.99]) == ("the rounds' speedups spread 11% (1.03-1.14x, of five or "
                                                            "more the highest and the lowest left out)")
    said = judge(claim, 4.87, [2.0, 4.87, 9.0], why)
    assert "NOT COMPARABLE, this host is too noisy" in said and "over the 10% this comparison can bear" in said
    assert "rerun on an idle host" in said and "within" not in said
    assert judge(None, 1.0, [1.0], "") == "the PR's figure: not found in fusebot.json beside this script"
    assert judge(None, 1.0, [1.0], why).endswith(f"beside this script; this host is too noisy for a figure ({why}): "
                                                 "rerun on an idle host")


def test_a_claim_raised_to_the_parents_clock_is_met_by_a_faster_own_time_and_not_by_a_slower_one(tmp_path):
    """A 5.6 us rewrite whose harness time was raised to 9 us, the least its back-to-back calls took by the parent's
    clock: the manifest says so, and the script's own time with flushed caches (6.77x against the stated 4.22x, as on
    an H200) is above that claim, not outside it; below the claim's spread is still outside."""
    from runner.contract import Timing
    from runner.results.bench_script import figures_json

    raised = Timing(median_ms=0.009, iqr_ms=0.0001, mean_ms=0.009, min_ms=0.0089, n=100, samples_ms=[0.009] * 3,
                    clock="cuda_events", l2_flushed=True, parent_ms=0.009)
    honest = raised.model_copy(update={"median_ms": 0.012, "parent_ms": 0.009})
    assert figures_json({"fusebot": raised})["fusebot"]["raised_to_parent_ms"] == 0.009
    assert "raised_to_parent_ms" not in figures_json({"fusebot": honest})["fusebot"]
    manifest = {**MANIFEST, "timings": {**MANIFEST["timings"], "fusebot": _timed(0.009) | {"raised_to_parent_ms":
                                                                                           0.009}},
                "rounds_vs_faster": [4.22, 4.22, 4.23], "margin": 0.03}
    g = script_functions(tmp_path, manifest)
    claim = g["stated"]()
    assert claim["host_bound"] and not script_functions(tmp_path / "plain", MANIFEST)["stated"]()["host_bound"]
    above = g["judge"](claim, 6.77, [6.7, 6.77, 6.8], "")
    assert "here 6.77x: above the PR's stated spread, as a host-bound claim is" in above and "OUTSIDE" not in above
    assert "OUTSIDE the PR's stated spread" in g["judge"](claim, 3.0, [3.0], "")
    plain = script_functions(tmp_path / "plain2", MANIFEST)
    assert "OUTSIDE" in plain["judge"](plain["stated"](), 9.0, [9.0], "")  # a claim not raised: above is outside


def test_the_timed_shape_is_named_per_tensor_input(tmp_path):
    shapes_text = script_functions(tmp_path, None)["shapes_text"]
    assert shapes_text([torch.zeros(4, 3), 2.0, torch.zeros(5, dtype=torch.float16)]) == \
        "(4, 3) float32, (5) float16"
    assert shapes_text([1.0]) == "no tensor inputs"
