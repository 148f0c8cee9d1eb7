"""`fusebot optimize` end to end on the CPU backend: the real harness (builds with g++, verifies, times), the real
openai client against the scripted server, the result folder, the generated drop-in test, and a SIGKILL mid-search
followed by a resume that redoes no finished work."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from runner.harness.build import cpu_level
from runner.search.trace import read_events
from tests.fakes.llm_server import Reply, ScriptedLLM
from tests.runner.cpu_kernels import BROKEN, GOOD, PROBLEM, SLOW, WRONG, answer
from tests.runner.llm_helpers import IDEAS, SECRET
from tests.session_env import denied_by_noise, session_env

ROOT = Path(__file__).resolve().parents[3]
IDEAS_T, IMPL_T, REPAIR_T = "## Task: ideas", "## Task: implement", "## Task: repair"


def cli_env(url: str, tmp: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOT_")}
    return env | {"FUSEBOT_LLM_BASE_URL": url, "FUSEBOT_LLM_API_KEY": SECRET, "FUSEBOT_LLM_MODELS": "scripted-a",
                  "FUSEBOT_LLM_BACKOFF_INITIAL_S": "0.01", "FUSEBOT_LLM_TIMEOUT_S": "30",
                  **session_env(),
                  "FUSEBOT_DROPIN_CACHE": str(tmp / "dropin-cache"),
                  # one thread for eager torch: on a small shared CI machine a thread pool makes baselines erratic
                  "OMP_NUM_THREADS": "1"}


def optimize(out: Path, env: dict, *extra: str, **kw) -> subprocess.Popen:
    # the scripted model alone: the catalog would find its own kernel for this elementwise chain
    cmd = [sys.executable, "-m", "runner.cli.optimize", str(PROBLEM), "--out", str(out), "--backend", "cpu",
           "--no-compile-baseline", "--no-builtin", *extra]
    return subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True, **kw)


@pytest.mark.slow
def test_optimize_writes_a_verified_kernel_dropin_test_report_and_result(tmp_path):
    """The whole flow, whatever the CPU's timings decide: the good kernel is verified, and either it is proposed (the
    kernel, drop-in and generated test ship, and the test passes) or the timings denied the claim, which says so, and
    no kernel file ships. (A one-thread kernel against eager measured 0.21-20.92x over the confirmation's rounds on the
    idle 2-core CI machine: this test asserts the flow, never the verdict.)"""
    script = [
        Reply(IDEAS, match=IDEAS_T),
        Reply(answer(BROKEN), match=IMPL_T, times=1),
        Reply(answer(WRONG), match=IMPL_T, times=1),
        Reply("I think the best approach is a single pass, but I'll skip the code.", match=IMPL_T, times=1),
        Reply(answer(GOOD, "first"), match=IMPL_T, times=1),
        Reply(answer(GOOD, "repaired"), match="flaot v"),  # the repair of the build error
        Reply(answer(GOOD, "fixed-relu"), match=REPAIR_T),
    ]
    out = tmp_path / "out"
    with ScriptedLLM(script) as srv:
        p = optimize(out, cli_env(srv.url, tmp_path), "--rounds", "1", "--ideas", "2", "--implementations", "2",
                     "--max-repairs", "1")
        log, _ = p.communicate(timeout=600)
    assert p.returncode == 0, log
    result = json.loads((out / "result.json").read_text())
    said = result["message"]
    claimed = result["improved"] is True
    assert claimed or denied_by_noise(result), (said, _verdict_reasons(out / "trace.jsonl"), log[-4000:])
    if claimed:
        v = result["verdict"]
        assert v["accepted"] and v["timing"]["median_ms"] < result["baselines"]["eager"]["median_ms"]
    summary = result["trace_summary"]
    # the no-code answer, and its re-ask when the scripted server has no reply left for it: the four implement calls
    # run at once, so which prompt gets which scripted reply varies from run to run
    assert summary["no_code"] in (1, 2), summary
    # the broken and the wrong kernel are rejected for what they are; the three good ones are accepted, unless the
    # parent's clocks on a loaded host did not bear out the timer (a measurement's verdict, stated as such)
    judged = {e["verdict"]["candidate_id"]: e["verdict"] for e in _events(out / "trace.jsonl")
              if e.get("event") == "evaluated"}
    stages = sorted(v["stage"] for v in judged.values() if not v["accepted"])
    good = [v for v in judged.values() if v["stage"] in ("done", "time")]
    assert len(judged) == 5 and stages.count("build") == 1 and stages.count("verify") == 1, _verdict_reasons(
        out / "trace.jsonl")
    assert len(good) == 3 and all(v["accepted"] or _measured_out(v) for v in good), good
    assert summary["accepted"] == sum(v["accepted"] for v in good) and summary["rejected"] == 5 - summary["accepted"]
    kernel_files = ["kernel.cpp", "fusebot.h", "reference.py", "dropin.py", "test_dropin.py",
                    f"kernel.{cpu_level()}.so.b64"]  # the last: the library the drop-in ships
    assert sorted(result["files"]) == sorted(["report.md", "result.json", *(kernel_files if claimed else [])])
    report = (out / "report.md").read_text()
    assert "| PyTorch eager |" in report and "| roofline floor |" in report and "rejected at build" in report
    assert "Vectorize loads with float4" in report and "mismatch" in report and "no candidate" in report
    repair = next(r for r in srv.completions() if REPAIR_T in r.text and "flaot" in r.text)
    assert "error" in repair.text and "### Compiler output" in repair.text  # g++'s own message went back
    assert SECRET not in log and SECRET not in (out / "trace.jsonl").read_text() and SECRET not in report
    if claimed:
        gen = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(out)], cwd=out,
                             env=cli_env(srv.url, tmp_path), capture_output=True, text=True, timeout=300)
        assert gen.returncode == 0 and "5 passed" in gen.stdout, gen.stdout + gen.stderr


def _nothing_proposed(tmp_path: Path, kernel: str, env: dict) -> tuple[dict, str, Path]:
    """optimize over one scripted kernel, into a result folder that holds a stale drop-in from an earlier run."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "dropin.py").write_text("# stale, from an earlier run")
    script = [Reply(IDEAS, match=IDEAS_T), Reply(answer(kernel), match=IMPL_T), Reply("no", match=REPAIR_T)]
    with ScriptedLLM(script) as srv:
        env["FUSEBOT_LLM_BASE_URL"] = srv.url
        p = optimize(out, env, "--rounds", "1", "--ideas", "1", "--implementations", "1")
        log, _ = p.communicate(timeout=300)
    assert p.returncode == 0, log
    result = json.loads((out / "result.json").read_text())
    assert result["improved"] is False, result["message"]
    assert result["files"] == ["report.md", "result.json"] and not (out / "dropin.py").exists()
    assert not (out / "kernel.cpp").exists()
    assert "no improvement" in log
    return result, log, out


@pytest.mark.slow
def test_when_no_candidate_is_verified_it_says_so_and_writes_no_kernel(tmp_path):
    """The decline flow, decided by correctness alone: the only kernel is wrong, so nothing ships, the stale drop-in
    is removed, and the report says why. (The rule that declines a verified but slower kernel is tested with injected
    measurements in tests/runner/results; with a real slow kernel in `make bench-check`, below.)"""
    result, _, out = _nothing_proposed(tmp_path, WRONG, cli_env("", tmp_path))
    assert result["message"].startswith("no candidate was verified"), result["message"]
    assert not (result["verdict"] or {}).get("accepted")
    report = (out / "report.md").read_text()
    assert "**No improvement**" in report and "mismatch" in report, report


@pytest.mark.slow
@pytest.mark.timing
def test_when_nothing_beats_the_baselines_it_says_so_and_writes_no_kernel(tmp_path):
    # the product's own timing (tests/conftest.py), not the suite's: on a loaded CI host the suite's spread threshold
    # (which lets every round through) once measured this 200-times-repeated kernel at "2.17x faster than eager"
    # (0.46-3.80x over 5 rounds)
    result, _, out = _nothing_proposed(tmp_path, SLOW, cli_env("", tmp_path))
    message = result["message"]
    if message.startswith("slower: the fastest verified kernel lost every round") or \
            "unstable-measurement" in message or "rounds' medians spread" in message:
        # its rounds spread too far for a figure (on the idle 2-core host: 0.01-0.03x over 5 rounds), and it lost
        # every one, or the host was too noisy for any: said so, and nothing proposed
        assert "not proposed" in message and "**No improvement**" in (out / "report.md").read_text(), message
        return
    assert message.startswith("nothing beat eager"), message
    assert result["verdict"]["accepted"] is True  # verified, just slower
    assert "**No improvement**: nothing beat eager" in (out / "report.md").read_text()


def test_usage_errors_exit_2_with_a_message(tmp_path):
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOT_")}
    missing = subprocess.run([sys.executable, "-m", "runner.cli.optimize", str(tmp_path / "nope.py"), "--out",
                              str(tmp_path / "o")], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert missing.returncode == 2 and "no such file" in " ".join((missing.stdout + missing.stderr).split())
    # (with no LLM configured, optimize runs the builtin catalog: tests/runner/test_bench_cli.py)
    p = optimize(tmp_path / "o", env | {"FUSEBOT_LLM_BASE_URL": "ftp://x", "FUSEBOT_LLM_API_KEY": SECRET,
                                        "FUSEBOT_LLM_MODELS": "m"})
    log, _ = p.communicate(timeout=120)
    assert p.returncode == 2 and "FUSEBOT_LLM_BASE_URL" in log and SECRET not in log


def _events(trace: Path) -> list[dict]:
    return list(read_events(trace)) if trace.exists() else []


def _measured_out(verdict: dict) -> bool:
    """A verified kernel rejected at timing by the parent's cross-check alone."""
    return verdict["stage"] == "time" and all(r.startswith("timer-escape") for r in verdict["reasons"])


def _verdict_reasons(trace: Path) -> list:
    """Each judged candidate's id, stage and reasons, for a failure's message."""
    return [(e["verdict"].get("candidate_id"), e["verdict"].get("stage"), e["verdict"].get("reasons"))
            for e in _events(trace) if isinstance(e.get("verdict"), dict)]


@pytest.mark.slow
def test_a_search_killed_mid_way_resumes_without_redoing_finished_work(tmp_path):
    """SIGKILL the whole `fusebot optimize` process group once some verdicts are in the trace, run it again: no
    answered prompt is sent again, no evaluated candidate is evaluated again, and the search completes."""
    impls = [Reply(answer(GOOD, f"v{k}"), match=IMPL_T, times=1) for k in range(8)]
    script = [Reply(IDEAS, match=IDEAS_T), *impls, Reply(answer(BROKEN), match=IMPL_T)]
    out = tmp_path / "out"
    trace = out / "trace.jsonl"
    args = ("--rounds", "1", "--ideas", "2", "--implementations", "2")  # 4 candidates: the kill leaves 2 or 3 to do
    with ScriptedLLM(script) as srv:
        env = cli_env(srv.url, tmp_path)
        first = optimize(out, env, *args)
        deadline = time.monotonic() + 480
        while not any(e["event"] == "evaluated" for e in _events(trace)):
            assert first.poll() is None and time.monotonic() < deadline, first.communicate()[0]
            time.sleep(0.05)
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=30)
        assert first.returncode == -signal.SIGKILL
        before = _events(trace)
        n_before = len(srv.completions())
        answered = [e for e in before if e["event"] == "answer"]
        evaluated = {e["candidate"]["id"] for e in before if e["event"] == "evaluated"}
        assert answered and evaluated and not any(e["event"] == "end" for e in before)

        second = optimize(out, env, *args)
        log, _ = second.communicate(timeout=600)
        assert second.returncode == 0, log
    after = _events(trace)[len(before):]
    assert after[0]["event"] == "resume" and after[-1]["event"] == "end"
    # no finished evaluation was redone
    again = {e["candidate"]["id"] for e in after if e["event"] == "evaluated"}
    assert again and not (again & evaluated)
    # no answered prompt was asked again: the first len(answered) successful requests are the answered ones
    ok_first = [r for r in srv.completions()[:n_before] if r.status == 200][: len(answered)]
    asked_again = [r for r in srv.completions()[n_before:] if any(r.body == o.body for o in ok_first)]
    assert asked_again == []
    assert {e["key"] for e in after if e["event"] == "answer"}.isdisjoint(e["key"] for e in answered)
    result = json.loads((out / "result.json").read_text())
    assert result["trace_summary"]["candidates"] == len(evaluated | again)
    new_answers = [e for e in after if e["event"] == "answer"]
    assert result["trace_summary"]["tokens_used"] == 300 * (len(answered) + len(new_answers))


SEARCH_ONCE = ("--backend", "cpu", "--rounds", "1", "--ideas", "1", "--implementations", "1", "--no-compile-baseline")
RAISES = '''import torch


# fusebot: optimize
class Gain(torch.nn.Module):
    def forward(self, x):
        return x * 2


def get_inputs():
    raise ValueError("dataset not found")
'''
SHAPE_BUG = '''import torch


# fusebot: optimize
class Proj(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(64, 32)

    def forward(self, x):
        return self.lin(x)


def get_inputs():
    return [torch.rand(16, 100)]
'''


def optimize_here(cwd: Path, *args: str) -> subprocess.CompletedProcess:
    """`fusebot optimize` as a user runs it in their project, with the path typed relative to it; no LLM."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOT_")} | session_env() | {
        "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "bot.cli", "optimize", *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("source", "line", "said"), [
    (RAISES, 11, "get_inputs() failed: ValueError: dataset not found"),
    (SHAPE_BUG, 11, "your module's forward failed: RuntimeError: mat1 and mat2 shapes cannot be multiplied "
                    "(16x100 and 64x32)"),
])
def test_a_broken_module_is_the_users_mistake_at_their_file_and_line_exit_2(tmp_path, source, line, said):
    (tmp_path / "models").mkdir()
    (tmp_path / "models/x.py").write_text(source)
    p = optimize_here(tmp_path, "models/x.py", "--out", "out", *SEARCH_ONCE)
    assert p.returncode == 2, p.stderr
    assert p.stderr.splitlines()[-1] == f"error: models/x.py:{line}: {said}"
    assert not [w for w in ("machine", "judge", "baselines", str(tmp_path)) if w in p.stderr.splitlines()[-1]]
    # off a terminal, the first minute is announced before anything runs the module
    assert "timing eager (once per problem and machine)" in p.stderr.split("error: ")[0]


def test_a_folder_is_not_a_file_and_bench_takes_folders(tmp_path):
    (tmp_path / "models").mkdir()
    p = optimize_here(tmp_path, "models", "--out", "out")
    assert p.returncode == 2 and p.stdout == ""
    assert p.stderr == "error: models is a folder: name one file of it, or run `fusebot bench models --out DIR` to " \
                       "search every problem file in it\n"


def test_the_search_docs_give_the_usage_and_the_one_exit_status_table():
    text = (ROOT / "docs/search.md").read_text()
    assert "fusebot optimize FILE[:CLASS] --out DIR" in text and "(exit-status.md)" in text
