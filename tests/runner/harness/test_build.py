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

# constexpr evaluation that keeps cc1plus busy (a child of g++) for minutes, in constant memory
SLOW = ("constexpr long spin() { long s = 0; for (long i = 0; i < 4000000000L; ++i) s += i ^ (s >> 3); return s; }\n"
        "static_assert(spin() != 1, \"\");\n")
SLOW_FLAGS = ["-fconstexpr-loop-limit=2147483647", "-fconstexpr-ops-limit=9223372036854775807"]


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


def test_the_build_timeout_kills_the_compilers_whole_tree(tmp_path):
    cache = tmp_path / "cache"
    start = time.monotonic()
    out = build.build(cpu(SLOW, SLOW_FLAGS), cache_dir=cache, timeout_s=3)
    assert not out.info.ok and "timed out" in out.info.log
    assert time.monotonic() - start < 20
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        left = [p for p in psutil.process_iter(["name", "cmdline"])
                if p.info["name"] in ("cc1plus", "g++", "bwrap") and str(cache) in " ".join(p.info["cmdline"] or [])]
        if not left:
            break
        time.sleep(0.1)
    assert left == []


def test_an_honest_build_still_builds_and_is_cached(tmp_path):
    src = ('#include "fusebot.h"\nextern "C" int fusebot_forward(const fb_tensor* in, int n_in, fb_tensor* out, '
           "int n_out, void* stream) { return 0; }\n")
    first = build.build(cpu(src), cache_dir=tmp_path / "cache")
    assert first.info.ok, first.info.log
    again = build.build(cpu(src), cache_dir=tmp_path / "cache")
    assert again.info.cached and again.library == first.library
    assert (tmp_path / "cache").stat().st_mode & 0o077 == 0
