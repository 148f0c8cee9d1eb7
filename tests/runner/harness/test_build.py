"""The compiler as an untrusted process: it sees only the toolchain and its own directory, its log is scrubbed, and
its whole process tree dies on timeout."""

from __future__ import annotations

import os
import shutil
import time

import psutil
import pytest

from runner.contract import Candidate
from runner.harness import build

SECRET = "ghp_" + "Zx9Qw8Er7Ty6Ui5Op4As3Df2Gh1Jk0Lm9Nb8"

pytestmark = pytest.mark.skipif(shutil.which("bwrap") is None and not os.environ.get("CI"),
                                reason="bubblewrap is not installed here (CI installs it: .ci/run)")

def cpu(source: str, flags: list[str] | None = None, cid: str = "c") -> Candidate:
    return Candidate(id=cid, format="fast", backend="cpu", sources={"kernel.cpp": source}, extra_cflags=flags or [])


def test_an_include_of_a_credentials_file_quotes_neither_its_content_nor_its_path(tmp_path):
    creds = tmp_path / "outside" / ".git-credentials"
    creds.parent.mkdir()
    creds.write_text(f"https://bot:{SECRET}@github.com\n")
    out = build.build(cpu(f'#include "{creds}"\nint x;\n'), cache_dir=tmp_path / "cache")
    assert not out.info.ok
    assert SECRET not in out.info.log and str(creds.parent) not in out.info.log
    assert "No such file" in out.info.log  # outside the sandbox's view: it does not exist for the compiler


def test_a_credential_in_the_source_is_redacted_from_the_build_log(tmp_path):
    out = build.build(cpu(f'#error "{SECRET}"\n'), cache_dir=tmp_path / "cache")
    assert not out.info.ok and "#error" in out.info.log and SECRET not in out.info.log


def _spin(name: str) -> str:
    """A `-wrapper` (the candidate chooses its flags) that makes g++ run its cc1plus step as a long sleep under a
    name of its own (its comm: readable whatever the process does)."""
    return f"/bin/sh,-c,cp /bin/sleep {name} && exec ./{name} 3600"


def _alive(name: str) -> list[int]:
    left = [p.pid for p in psutil.process_iter(["name", "status"])
            if p.info["name"] == name and p.info["status"] != psutil.STATUS_ZOMBIE]  # a zombie runs nothing
    for pid in left:
        os.kill(pid, 9)
    return left


def _running(name: str) -> bool:
    return any(p.info["name"] == name and p.info["status"] != psutil.STATUS_ZOMBIE
               for p in psutil.process_iter(["name", "status"]))


def test_the_build_timeout_kills_the_compilers_whole_tree(tmp_path):
    name = f"fbspin{os.getpid()}"[:15]
    start = time.monotonic()
    out = build.build(cpu("int x;\n", ["-wrapper", _spin(name)]), cache_dir=tmp_path / "cache", timeout_s=3)
    assert not out.info.ok and "timed out" in out.info.log
    assert time.monotonic() - start < 20
    assert _alive(name) == []  # when build() returns, not a moment later


def test_a_daemon_the_compiler_starts_dies_with_the_build(tmp_path):
    name = f"fbdmn{os.getpid()}"[:15]
    out = build.build(cpu("int x;\n", ["-wrapper", "/usr/bin/setsid,-f," + _spin(name)]),
                      cache_dir=tmp_path / "cache", timeout_s=60)
    assert not out.info.ok  # (no cc1plus ran: nothing to assemble)
    # the sandbox's PID namespace ends with the build, and the kernel kills what is left in it: on a loaded host the
    # killed daemon may take a moment to exit
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and _running(name):
        time.sleep(0.05)
    assert _alive(name) == []


def test_an_honest_build_still_builds_and_is_cached(tmp_path):
    src = ('#include "fusebot.h"\nextern "C" int fusebot_forward(const fb_tensor* in, int n_in, fb_tensor* out, '
           "int n_out, void* stream) { return 0; }\n")
    first = build.build(cpu(src), cache_dir=tmp_path / "cache")
    assert first.info.ok, first.info.log
    again = build.build(cpu(src), cache_dir=tmp_path / "cache")
    assert again.info.cached and again.library == first.library
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0


def test_a_compiler_fed_dev_zero_is_stopped_by_its_memory_cap_not_its_timeout(tmp_path):
    """`#include "/dev/zero"` grows cc1plus without bound: the address-space cap fusebot sets stops it, with a
    build verdict that says so (the timeout is far away)."""
    c = Candidate(id="zero", format="fast", backend="cpu", sources={"kernel.cpp": '#include "/dev/zero"\n'})
    out = build.build(c, cache_dir=tmp_path, timeout_s=600, memory_bytes=512 << 20)
    assert not out.info.ok and out.library is None
    assert "out of memory" in out.info.log and "capped at 0.5 GiB" in out.info.log, out.info.log
    assert "timed out" not in out.info.log
