"""Adversarial tests of the confinement: what a hostile candidate tries, from inside a child confined exactly as a
candidate is (runner.harness.bwrap + runner.harness.sandbox.confine). Each attack here worked before bubblewrap."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import psutil
import pytest

from runner.contract import Candidate
from runner.harness import build, bwrap
from runner.harness.procs.process import Child, ChildDied, Limits
from runner.harness.sandbox import confined_env

HERE = Path(__file__).resolve().parent
SECRET = "ghp_" + "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lm9Nb8"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed here (CI installs it: .ci/run)")


class Hostile:
    """A confined child that runs the code it is given; its working directory is <eval>/cand, beside others."""

    def __init__(self, root: Path, limits: Limits | None = None, *, confine: bool = True, read: tuple[Path, ...] = ()):
        self.workdir = root / "eval" / "cand"
        env = confined_env(self.workdir)
        env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(HERE)])
        self.child = Child("hostile", self.workdir, env, limits or Limits(memory_bytes=2 << 30), read=list(read))
        self.confinement = self.child.request({"cmd": "init", "confine": confine}, 60)["confinement"]

    def run(self, code: str, timeout_s: float = 60) -> object:
        reply = self.child.request({"cmd": "run", "code": textwrap.dedent(code)}, timeout_s)
        assert reply.get("ok"), reply
        return reply["result"]


@pytest.fixture
def hostile(tmp_path):
    h = Hostile(tmp_path)
    yield h
    h.child.close()


@pytest.fixture
def bystander(tmp_path):
    """A process of the same user holding a credential in its environment, as the bot, the evaluator or the judge."""
    env = {**os.environ, "GITHUB_TOKEN": SECRET, "FUSEBOT_LLM_API_KEY": SECRET}
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)"], env=env)
    yield proc
    os.kill(proc.pid, signal.SIGCONT)
    proc.kill()
    proc.wait()


def test_the_child_runs_under_bubblewrap_and_says_so(hostile):
    assert hostile.confinement["bwrap"] and hostile.confinement["user_namespace"]
    assert not hostile.confinement["unsafe_no_sandbox"]
    assert hostile.run("import os; result = os.getpid()") < 10  # its own PID namespace


def test_no_other_process_environ_is_readable(hostile, bystander):
    found = hostile.run(f"""
        import os
        found = []
        for pid in [p for p in os.listdir('/proc') if p.isdigit()] + [{bystander.pid!r}, {os.getpid()!r}]:
            try:
                data = open(f'/proc/{{pid}}/environ', 'rb').read()
            except OSError:
                continue
            if {SECRET!r}.encode() in data:
                found.append(pid)
        result = found
    """)
    assert found == []


def test_other_processes_are_neither_visible_nor_signalable(hostile, bystander):
    """The bystander stands for the evaluator and the judge (stopping either hung the evaluation, or inflated the
    baseline it was timing); signalling the test process itself would stop this test, not fail it."""
    outcome = hostile.run(f"""
        import os, signal
        seen = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
        errors = []
        for sig in (signal.SIGSTOP, signal.SIGKILL):
            try:
                os.kill({bystander.pid}, sig)
                errors.append('sent')
            except OSError as exc:
                errors.append(type(exc).__name__)
        result = [seen, errors, os.getppid()]
    """)
    seen, errors, ppid = outcome
    assert bystander.pid not in seen and os.getpid() not in seen and max(seen) < 50 and ppid < 50
    time.sleep(0.2)
    assert bystander.poll() is None and psutil.Process(bystander.pid).status() != psutil.STATUS_STOPPED, errors


def test_files_outside_its_view_do_not_exist_for_it(hostile, tmp_path):
    (tmp_path / "credentials").write_text(SECRET)
    other = tmp_path / "eval" / "other-candidate"
    other.mkdir(parents=True)
    (other / "out_0.bin").write_text("honest")
    result = hostile.run(f"""
        import os
        got = {{}}
        for path in ({str(tmp_path / 'credentials')!r}, {str(other / 'out_0.bin')!r}, '/root/.git-credentials',
                     '/etc/shadow', {str(Path.home() / '.ssh')!r}):
            try:
                got[path] = open(path).read()[:40]
            except OSError as exc:
                got[path] = type(exc).__name__
        result = got
    """)
    assert SECRET not in str(result) and "honest" not in str(result), result


@pytest.fixture
def other_evaluation():
    """Another evaluation's output file where evaluations live (/dev/shm), as an honest candidate left it."""
    folder = Path("/dev/shm") / f"fusebot-eval-test-{os.getpid()}-{time.monotonic_ns()}" / "cand-honest"
    folder.mkdir(parents=True)
    (folder / "out_0.bin").write_text("honest")
    yield folder / "out_0.bin"
    shutil.rmtree(folder.parent, ignore_errors=True)


def test_writes_reach_neither_another_evaluation_nor_the_hosts_dev_shm(hostile, tmp_path, other_evaluation):
    sibling = tmp_path / "eval" / "other-candidate"
    sibling.mkdir(parents=True)
    (sibling / "out_0.bin").write_text("honest")
    marker = f"fusebot-test-{os.getpid()}-{time.monotonic_ns()}"
    result = hostile.run(f"""
        import subprocess
        # a shell, not Python: nothing in-process (the audit hook) stands in the way
        cmd = ('echo x > {other_evaluation}; echo x > {sibling}/out_0.bin; echo x > /dev/shm/{marker}; '
               'echo x > /tmp/{marker}; echo x > ../escaped')
        result = subprocess.run(['sh', '-c', cmd], capture_output=True, text=True).returncode
    """)
    assert other_evaluation.read_text() == "honest" and (sibling / "out_0.bin").read_text() == "honest"
    assert not Path("/dev/shm", marker).exists() and not Path("/tmp", marker).exists()
    assert not (tmp_path / "eval" / "escaped").exists(), result


def test_no_pathname_unix_socket_outside_is_reachable(hostile, tmp_path):
    path = tmp_path / "docker.sock"
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(1)
    server.settimeout(0.5)
    try:
        result = hostile.run(f"""
            import subprocess, sys
            code = "import socket; s = socket.socket(socket.AF_UNIX); s.connect({str(path)!r}); s.send(b'GET /')"
            result = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True).stderr[-200:]
        """)
        with pytest.raises(TimeoutError):
            server.accept()
        assert "Error" in result
    finally:
        server.close()


def _alive_with(marker: str) -> list[int]:
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if marker in " ".join(p.info["cmdline"] or []):
            out.append(p.pid)
    return out


def test_setsid_daemons_and_double_forked_orphans_die_with_the_evaluation(tmp_path):
    h = Hostile(tmp_path)
    secs = 3000 + os.getpid() % 1000  # a sleep no other test runs
    try:
        h.run(f"""
            import os, subprocess
            subprocess.Popen(['setsid', 'sleep', '{secs}'], start_new_session=True)
            if os.fork() == 0:
                os.setsid()
                if os.fork() == 0:
                    os.execvp('sleep', ['sleep', '{secs}.5'])
                os._exit(0)
        """)
        deadline = time.monotonic() + 5
        while len(_alive_with(f"sleep {secs}")) < 2 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(_alive_with(f"sleep {secs}")) == 2
    finally:
        h.child.close()
    assert _alive_with(f"sleep {secs}") == []  # gone when close() returns


def test_private_tmpfs_files_count_against_the_memory_cap(tmp_path):
    h = Hostile(tmp_path, Limits(memory_bytes=160 << 20), confine=False)
    try:
        with pytest.raises(ChildDied) as died:
            h.run("""
                import time
                for path in ('/dev/shm/fill', '/tmp/fill'):
                    with open(path, 'wb') as f:
                        for _ in range(70):
                            f.write(b'x' * (1 << 20))
                time.sleep(30)
            """, timeout_s=20)
        assert died.value.kind == "memory"
    finally:
        h.child.close()


@pytest.mark.parametrize("trap", ["fifo", "symlink", "sparse"])
def test_a_planted_child_log_neither_hangs_nor_leaks_the_log_tail(tmp_path, monkeypatch, trap):
    h = Hostile(tmp_path)
    plant = {"fifo": "os.mkfifo('child.log')", "symlink": "os.symlink('/proc/self/environ', 'child.log')",
             "sparse": "open('child.log', 'wb').truncate(2 << 30)"}[trap]
    code = f"import os, sys; print('last words', flush=True); os.unlink('child.log'); {plant}; os._exit(3)"
    monkeypatch.setenv("FUSEBOT_TEST_TOKEN", SECRET)  # in the parent's environment: /proc/self/environ of the parent
    start = time.monotonic()
    try:
        with pytest.raises(ChildDied) as died:
            h.run(code, timeout_s=20)
    finally:
        h.child.close()
    assert time.monotonic() - start < 10
    assert SECRET not in died.value.log_tail and len(died.value.log_tail) <= 4000
    assert "last words" in died.value.log_tail


def test_without_bubblewrap_nothing_untrusted_starts_unless_the_user_opts_out(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))  # no bwrap here
    monkeypatch.delenv(bwrap.UNSAFE_ENV, raising=False)
    bwrap._mode.cache_clear()
    try:
        with pytest.raises(bwrap.SandboxUnavailable, match="apt-get install bubblewrap"):
            Child("hostile", tmp_path / "w", {})
        monkeypatch.setenv(bwrap.UNSAFE_ENV, "yes")
        with pytest.raises(Exception, match="must be 1"):
            bwrap.require()
        monkeypatch.setenv(bwrap.UNSAFE_ENV, "1")
        mode = bwrap.require()
        assert mode.unsafe and mode.bwrap is None
        assert bwrap.wrap(["true"], tmp_path) == ["true"]
    finally:
        bwrap._mode.cache_clear()


@pytest.mark.gpu
def test_a_cuda_kernel_built_and_run_inside_the_sandbox(tmp_path):
    """On a GPU host: the device nodes and driver libraries are in the sandbox's view, nvcc builds in it, a CUDA
    kernel runs in it, and it still sees no host process."""
    src = ('#include "fusebot.h"\n__global__ void twice(float* x, int n) { int i = blockIdx.x * blockDim.x + '
           "threadIdx.x; if (i < n) x[i] *= 2.0f; }\n"
           'extern "C" int fusebot_forward(const fb_tensor* in, int n_in, fb_tensor* out, int n_out, void* s) {\n'
           "  twice<<<4, 256, 0, (cudaStream_t)s>>>((float*)in[0].data, 1024); return (int)cudaGetLastError(); }\n")
    import torch  # here only: the CPU tests of this module need no torch in the parent

    major, minor = torch.cuda.get_device_capability()
    out = build.build(Candidate(id="twice", format="fast", backend="cuda", sources={"k.cu": src}),
                      cuda_arch=f"sm_{major}{minor}", cache_dir=tmp_path / "cache")
    assert out.info.ok, out.info.log
    h = Hostile(tmp_path, read=(out.library.parent,))  # the built library, read-only
    try:
        result = h.run(f"""
            import ctypes, glob, os, torch
            lib = ctypes.CDLL({str(out.library)!r})
            x = torch.ones(1024, device='cuda')

            class T(ctypes.Structure):
                _fields_ = [('data', ctypes.c_void_p), ('dtype', ctypes.c_int32), ('ndim', ctypes.c_int32),
                            ('shape', ctypes.c_int64 * 8), ('strides', ctypes.c_int64 * 8)]

            t = T(x.data_ptr(), 0, 1)
            rc = lib.fusebot_forward(ctypes.byref(t), 1, ctypes.byref(t), 1, ctypes.c_void_p(0))
            torch.cuda.synchronize()
            result = [rc, float(x.sum()), sorted(glob.glob('/dev/nvidia*')), max(int(p) for p in os.listdir('/proc')
                                                                                  if p.isdigit())]
        """, timeout_s=300)
    finally:
        h.child.close()
    rc, total, devices, max_pid = result
    assert rc == 0 and total == 2048.0 and max_pid < 50, result
    assert {"/dev/nvidiactl", "/dev/nvidia-uvm", "/dev/nvidia0"} <= set(devices), devices


def test_a_confined_process_keeps_torch_compile_s_cache_in_its_own_directory(tmp_path, monkeypatch):
    # torch writes its default cache path (under the parent's /tmp) into os.environ once the parent has compiled
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", "/tmp/torchinductor_someone")
    env = confined_env(tmp_path)
    assert env["TORCHINDUCTOR_CACHE_DIR"] == str(tmp_path / "inductor")
    assert env["TMPDIR"] == env["HOME"] == str(tmp_path)


def test_a_hostile_reference_leaves_nothing_in_a_cache_another_problems_judge_loads(tmp_path, harness_cache):
    """The reference runs in the judge with torch.compile's cache: the folder keyed by its own problem's files. What a
    reference plants there is in no folder a judge of any other problem is given (one byte of the problem changed
    is another problem), and only a judge that runs the very same files, which could plant it itself, sees it."""
    from runner.contract import ProblemSpec
    from runner.harness import compile_cache
    from runner.harness.evaluator import Evaluator, HarnessConfig

    from ..conftest import PROBLEMS, scale_relu_spec

    problem = tmp_path / "planted.py"
    problem.write_text(textwrap.dedent("""
        import os, pathlib
        cache = pathlib.Path(os.environ["TORCHINDUCTOR_CACHE_DIR"])
        cache.mkdir(parents=True, exist_ok=True)
        (cache / "planted-by-the-reference").write_text("compiled code a later judge would load")
    """) + (PROBLEMS / "scale_relu.py").read_text())
    spec = ProblemSpec(name="planted", path=str(problem))
    cfg = HarnessConfig(compile_baseline=False, cache_dir=harness_cache)
    with Evaluator(spec, backend="cpu", config=cfg) as ev:
        ev.reference.start()
        judge_dir = ev.reference.workdir
    assert not judge_dir.exists()
    own = harness_cache / "inductor" / compile_cache.key(spec, "cpu")
    assert [p.parent for p in harness_cache.rglob("planted-by-the-reference")] == [own]
    problem.write_text(problem.read_text() + "\n")
    others = [compile_cache.key(s, d) for s, d in ((spec, "cpu"), (spec, "cuda"), (scale_relu_spec(), "cpu"))]
    assert own.name not in others and len(set(others)) == 3


def test_a_judges_compile_cache_is_keyed_by_every_file_it_may_read(tmp_path):
    """A module under a root: a helper file beside it changed is another key (it may change what the reference runs);
    the same files are the same key (the next judge of the same module starts warm); a root over the caps gets no
    shared folder at all."""
    from runner.contract import ProblemSpec
    from runner.harness import compile_cache

    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "model.py").write_text("import pkg.helper\n")
    (tmp_path / "pkg" / "helper.py").write_text("SCALE = 2\n")
    (tmp_path / ".git").mkdir()
    (tmp_path / ".git" / "index").write_text("history")
    spec = ProblemSpec(name="m", root=str(tmp_path), module="pkg.model", class_name="M")
    first = compile_cache.key(spec, "cpu")
    (tmp_path / ".git" / "index").write_text("other history")
    assert compile_cache.key(spec, "cpu") == first
    (tmp_path / "pkg" / "helper.py").write_text("SCALE = 3\n")
    assert compile_cache.key(spec, "cpu") not in (first, None)
    env = compile_cache.judge_env({"TORCHINDUCTOR_CACHE_DIR": "own"}, tmp_path / "cache", spec, "cpu")
    assert Path(env["TORCHINDUCTOR_CACHE_DIR"]).parent == tmp_path / "cache" / "inductor"
    assert env["TRITON_CACHE_DIR"].startswith(env["TORCHINDUCTOR_CACHE_DIR"])
    (tmp_path / "pkg" / "big.bin").write_bytes(b"\0" * (compile_cache.MAX_KEYED_BYTES + 1))
    assert compile_cache.key(spec, "cpu") is None
    assert compile_cache.judge_env({"TORCHINDUCTOR_CACHE_DIR": "own"}, tmp_path / "cache", spec, "cpu") == {
        "TORCHINDUCTOR_CACHE_DIR": "own"}


def test_a_sandbox_started_from_a_thread_outlives_that_thread(tmp_path):
    """bwrap's --die-with-parent fires when the *thread* that started it ends: a candidate process prestarted from a
    search chunk's thread was SIGKILLed when the chunk ended, and the next one to take it "died during 'init'". Every
    sandbox is started from one thread that lives as long as the process (bwrap.popen)."""
    box = {}

    def start() -> None:
        box["h"] = Hostile(tmp_path)

    t = threading.Thread(target=start)
    t.start()
    t.join(60)
    assert not t.is_alive()
    time.sleep(0.5)  # the thread is gone: its parent-death signal, had it been bwrap's parent, has fired
    h = box["h"]
    try:
        assert h.child.proc.poll() is None
        assert h.run("result = 6 * 7") == 42
    finally:
        h.child.close()
