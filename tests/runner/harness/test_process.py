"""The parent's side of a child: reading what the candidate controls without trusting it, starting it confined."""

from __future__ import annotations

import os
import threading
import time

from runner.harness.procs.process import Child, Limits, read_tail
from runner.harness.sandbox import confined_env, secret_variable


def _in_thread(fn, timeout_s: float = 5.0):
    out = []
    t = threading.Thread(target=lambda: out.append(fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "blocked"
    return out[0]


def test_read_tail_reads_only_the_end_of_a_regular_file(tmp_path):
    f = tmp_path / "child.log"
    f.write_bytes(b"x" * 10_000 + b"the end")
    assert read_tail(f, 7) == "the end"
    with open(f, "rb") as fh:
        assert read_tail(fh.fileno(), 3) == "end" and fh.tell() == 0


def test_read_tail_of_a_fifo_returns_at_once(tmp_path):
    f = tmp_path / "child.log"
    os.mkfifo(f)
    assert _in_thread(lambda: read_tail(f, 4000)) == ""


def test_read_tail_never_follows_a_symlink(tmp_path, monkeypatch):
    monkeypatch.setenv("PLANTED_TOKEN", "tail-must-not-see-this")
    f = tmp_path / "child.log"
    f.symlink_to("/proc/self/environ")
    assert read_tail(f, 4000) == ""


def test_read_tail_of_a_2_gib_sparse_file_reads_n_bytes(tmp_path):
    f = tmp_path / "child.log"
    with open(f, "wb") as fh:
        fh.truncate(2 << 30)
    start = time.monotonic()
    assert len(read_tail(f, 4000)) == 4000
    assert time.monotonic() - start < 0.5


def test_no_credential_reaches_a_confined_environment(tmp_path):
    base = {"GITHUB_TOKEN": "x", "FUSEBOT_LLM_API_KEY": "x", "FUSEBOT_WORKER_TOKEN": "x", "OPENAI_API_KEY": "x",
            "AWS_SECRET_ACCESS_KEY": "x", "ACTIONS_RUNTIME_TOKEN": "x", "HARMLESS_NAME": "ghp_" + "a1B2c3D4" * 5,
            "DB_PASSWORD": "x", "PATH": "/usr/bin", "LANG": "C.UTF-8", "FUSEBOT_UNSAFE_NO_SANDBOX": "0"}
    env = confined_env(tmp_path, base=base)
    assert set(env) >= {"PATH", "LANG", "FUSEBOT_UNSAFE_NO_SANDBOX"}
    assert not [k for k in base if k in env and secret_variable(k, base[k])]
    assert not {"GITHUB_TOKEN", "FUSEBOT_LLM_API_KEY", "HARMLESS_NAME", "OPENAI_API_KEY"} & set(env)


def test_pss_is_read_only_where_resident_sizes_sum_over_the_cap(monkeypatch):
    """A process's PSS costs the parent a walk of its page tables, on every poll of every live child: it is read only
    where the resident sizes (never under it) with the files sum over the cap, and then it is what counts."""
    import psutil

    walks = []

    def pss(self):
        walks.append(self.pid)
        return type("Full", (), {"pss": 100 << 20})()

    monkeypatch.setattr(psutil.Process, "memory_full_info", pss)
    child = Child.__new__(Child)
    child._sandbox_pids = lambda: [psutil.Process(os.getpid())]
    child._tmpfs_bytes = lambda: 0
    child._files_bytes = lambda: 1 << 20
    resident = psutil.Process(os.getpid()).memory_info().rss
    child.limits = Limits(memory_bytes=resident * 4)
    assert child._rss() >= resident and walks == []
    child.limits = Limits(memory_bytes=resident // 2)
    assert child._rss() == (100 << 20) + (1 << 20) and walks == [os.getpid()]
