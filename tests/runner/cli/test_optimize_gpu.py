"""`fusebot optimize --backend cuda` end to end on the H100 (skipped without a GPU): the scripted server's CUDA-C
answers are built by nvcc, verified and timed by the real harness; a build error and a wrong result go back for
repair; the result folder is written, and where a kernel won, its generated drop-in test passes on the GPU.
Run on the device: `python -m pytest -q -s -m gpu tests/runner/test_search_gpu.py` (prints report.md)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.cli.test_optimize import IDEAS_T, IMPL_T, REPAIR_T, ROOT, cli_env
from tests.runner.cuda_kernels import BROKEN, PROBLEM, SCALAR, VEC4, WRONG, answer
from tests.runner.llm_helpers import IDEAS

pytestmark = pytest.mark.gpu


def test_optimize_on_cuda_builds_verifies_times_and_repairs(tmp_path):
    script = [
        Reply(IDEAS, match=IDEAS_T),
        Reply(answer(BROKEN), match=IMPL_T, times=1),
        Reply(answer(WRONG), match=IMPL_T, times=1),
        Reply(answer(SCALAR, "scalar"), match=IMPL_T, times=1),
        Reply(answer(VEC4, "vec4"), match=IMPL_T, times=1),
        Reply(answer(VEC4, "vec4-round2"), match=IMPL_T),
        Reply(answer(SCALAR, "repaired-build"), match='identifier "flaot"'),
        Reply(answer(VEC4, "repaired-relu"), match=REPAIR_T),
    ]
    out = tmp_path / "out"
    with ScriptedLLM(script) as srv:
        env = cli_env(srv.url, tmp_path)
        cmd = [sys.executable, "-m", "runner.cli.optimize", str(PROBLEM), "--out", str(out), "--backend", "cuda",
               "--rounds", "2", "--ideas", "2", "--implementations", "2", "--max-repairs", "1", "-v"]
        done = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=900)
    print(done.stdout[-4000:], done.stderr[-6000:])
    assert done.returncode == 0
    report = (out / "report.md").read_text()
    print(report)
    result = json.loads((out / "result.json").read_text())
    s = result["trace_summary"]
    assert s["accepted"] >= 3 and s["rejected"] >= 2
    assert "rejected at build" in report and "mismatch" in report
    repair = next(r for r in srv.completions() if REPAIR_T in r.text and "flaot" in r.text)
    assert 'identifier "flaot" is undefined' in repair.text  # nvcc's own message went back to the model
    assert "H100" in srv.completions()[0].text or "NVIDIA" in srv.completions()[0].text  # the GPU is in the prompt
    best = result["verdict"]
    assert best["accepted"] and best["timing"]["clock"] == "cuda_events" and best["timing"]["l2_flushed"]
    if result["improved"]:
        gen = subprocess.run([sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", str(out)],
                             cwd=out, env=env, capture_output=True, text=True, timeout=600)
        print(gen.stdout[-3000:])
        assert gen.returncode == 0 and "6 passed" in gen.stdout  # the graph's capture and replay among them
        assert "PASSED test_dropin.py::test_cuda_graph_capture_and_replay" in gen.stdout
        assert list(out.glob("kernel.*.cubin.b64")) and not list(out.glob("*.so.b64"))  # device code only
    else:
        # nothing won, or a kernel at the memory floor beside torch.compile's was within the minimum effect
        assert not (out / "dropin.py").exists()
        assert result["message"].startswith(("nothing beat", "below the minimum effect")), result["message"]
