"""What a result's manifest says (what was verified, every contestant's figures but not its raw samples, the margin,
the choice) and a PyTorch rewrite's files (its module's new text at its own path, a diff that applies); BENCHMARK.md's "Reproduce"
runs the bench script. The shapes come from the example module itself, described in a confined child process."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from runner.contract import Baselines, Candidate, Confirmation, Environment, TrialResult, Verdict
from runner.results.files import Provenance, rewrite_files, slug, target_files, write_files
from runner.results.proposal import manifest_extra, unified_diff
from runner.results.shapes import shapes_text, verified_inputs
from tests.fakes.evaluators import timing
from tests.verdicts import EXAMPLE, SPEC, seed_candidate

FOLDER = slug(SPEC.name)
ENV = Environment(device="cpu", cpu="AMD EPYC (test)", torch="2.13.0", python="3.11.4", fusebot="0.1")


def verdict() -> Verdict:
    conf = Confirmation(rounds=2, candidate_ms=[0.5, 0.5], eager_ms=[2.0, 2.0], compile_ms=[1.0, 1.1],
                        speedup_vs_eager=[4.0, 4.0], speedup_vs_compile=[2.0, 2.2])
    trials = [TrialResult(index=i, shape_set=i // 4, distribution="factory", passed=True, max_abs_err=1e-7 * i,
                          max_rel_err=1e-6 * i) for i in range(7)]
    return Verdict(candidate_id="fused", problem=SPEC.name, accepted=True, timing=timing(0.5), trials=trials,
                   baselines=Baselines(eager=timing(2.0), compile=timing(1.0)), confirmation=conf, environment=ENV)


def test_the_example_is_described_as_the_harness_verified_it():
    verified = verified_inputs(SPEC)
    assert [s["inputs"] for s in verified["shape_sets"]] == [[{"shape": [256, 4096], "dtype": "float32"}],
                                                            [{"shape": [515, 4096], "dtype": "float32"}]]
    assert verified["shape_sets"][0]["outputs"] == [{"shape": [256, 4096], "dtype": "float32"}]
    assert (verified["atol"], verified["rtol"]) == (1e-4, 1e-4)
    assert shapes_text(verified) == "(256, 4096) float32; (515, 4096) float32"
    assert verified_inputs(SPEC.model_copy(update={"module": "examples.no_such_module"})) == {}


def test_the_manifest_carries_what_was_verified_and_every_raw_sample():
    v = verdict()
    rewrite = timing(0.9, n=12)
    extra = manifest_extra(v, backend="cpu", margin=0.05, choice="why", rewrite=rewrite,
                           verified={"shape_sets": [{"inputs": []}], "atol": 1e-4, "rtol": 1e-4})
    files = target_files(SPEC, seed_candidate(), v, Provenance.for_verdict(SPEC.name, v), extra=extra)
    m = json.loads(files[f"{FOLDER}/fusebot.json"])
    assert m["kernel"] == "kernel.cpp" and m["change"] == "kernel" and m["margin"] == 0.05 and m["choice"] == "why"
    t = m["timings"]
    assert set(t) == {"PyTorch eager", "torch.compile", "fusebot", "PyTorch rewrite"}
    assert t["fusebot"]["median_ms"] == v.timing.median_ms and t["PyTorch rewrite"]["n"] == 12
    assert not any("samples_ms" in x for x in t.values())  # raw samples stay out of the branch
    ver = m["verified"]
    assert (ver["backend"], ver["device"], ver["trials"], ver["shape_sets"]) == ("cpu", "AMD EPYC (test)", 7, 2)
    assert ver["max_abs_err"] == 6e-7 and ver["atol"] == 1e-4 and m["rounds_vs_faster"] == [2.0, 2.2]
    bench = files[f"{FOLDER}/BENCHMARK.md"]
    reproduce = bench.split("## Reproduce", 1)[1]
    assert f"python fusebot_kernels/{FOLDER}/bench_{FOLDER}.py" in reproduce
    assert "pytest checks correctness only" in reproduce
    assert reproduce.index("bench_") < reproduce.index("pytest")  # the figures first: pytest times nothing
    assert "| PyTorch rewrite | 0.9 |" in bench and f"{FOLDER}/bench_{FOLDER}.py" in files


def test_a_rewrite_changes_the_module_file_with_a_diff_that_applies(tmp_path):
    old = EXAMPLE.read_text()
    new = old.replace("return [torch.randn(batch, features)]", "return [torch.randn(batch, features)]  # same")
    cand = Candidate(id="w", format="kernelbench", backend="cpu", sources={"model_new.py": "x"}, rewrite=new)
    v = verdict()
    files = rewrite_files(SPEC, cand, v, Provenance.for_verdict(SPEC.name, v, commit="abc"),
                          module_file="examples/mlp_epilogue.py", original_text=old,
                          extra=manifest_extra(v, backend="cpu", change="rewrite"))
    assert files["/examples/mlp_epilogue.py"] == new
    assert sorted(files) == sorted(["/examples/mlp_epilogue.py", f"{FOLDER}/BENCHMARK.md", f"{FOLDER}/fusebot.json",
                                    f"{FOLDER}/bench_{FOLDER}.py", f"{FOLDER}/test_{FOLDER}.py"])
    assert f"python -m pytest -q fusebot_kernels/{FOLDER}/test_{FOLDER}.py" in files[f"{FOLDER}/bench_{FOLDER}.py"]
    m = json.loads(files[f"{FOLDER}/fusebot.json"])
    assert m["kind"] == "rewrite" and "kernel" not in m and set(m["timings"]) == {"PyTorch eager", "torch.compile",
                                                                                "PyTorch rewrite"}
    repo = tmp_path / "r"
    (repo / "examples").mkdir(parents=True)
    (repo / "examples" / "mlp_epilogue.py").write_text(old)
    subprocess.run(["git", "init", "-q"], cwd=repo, check=True)
    (repo / "p.diff").write_text(m["diff"])
    subprocess.run(["git", "apply", "p.diff"], cwd=repo, check=True)
    assert (repo / "examples" / "mlp_epilogue.py").read_text() == new
    assert unified_diff("a.py", "x\n", "x\n") == ""
    assert "| PyTorch rewrite | 0.5 |" in files[f"{FOLDER}/BENCHMARK.md"]
    reproduce = files[f"{FOLDER}/BENCHMARK.md"].split("## Reproduce", 1)[1]
    assert f"python -m pytest -q fusebot_kernels/{FOLDER}/test_{FOLDER}.py" in reproduce  # its equivalence test


def test_the_pipeline_writes_no_rewrite_path_under_the_kernels_directory(tmp_path):
    written = write_files(tmp_path, {"/examples/x.py": "new", "x/BENCHMARK.md": "b"})
    assert written == [tmp_path / "x" / "BENCHMARK.md"] and not Path(tmp_path / "examples").exists()
