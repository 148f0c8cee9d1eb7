"""The drop-in's build cache: per user, private, keyed by everything the library depends on, checked before loading."""

from __future__ import annotations

import importlib.util
import os
import stat
import sys
from pathlib import Path

import pytest

from runner.contract import ProblemSpec
from runner.harness.dropin import HEADER_FILE, REFERENCE_FILE, dropin_source, kernel_filename

ROOT = Path(__file__).resolve().parents[3]
PROBLEM = ROOT / "tests/fixtures/problems/scale_relu.py"
KERNEL = (ROOT / "tests/fixtures/candidates/scale_relu_ok.cpp").read_text()
SPEC = ProblemSpec(name="scale_relu", path=str(PROBLEM))


@pytest.fixture
def dropin(tmp_path, monkeypatch):
    """The generated drop-in module (CPU), its cache under a fresh XDG_CACHE_HOME."""
    folder = tmp_path / "kernels"
    folder.mkdir()
    (folder / kernel_filename("cpu")).write_text(KERNEL)
    (folder / HEADER_FILE).write_text((ROOT / "runner/csrc/fusebot.h").read_text())
    (folder / REFERENCE_FILE).write_text(PROBLEM.read_text())
    (folder / "dropin.py").write_text(dropin_source(SPEC, "cpu"))
    monkeypatch.delenv("FUSEBOT_DROPIN_CACHE", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    name = f"dropin_cache_{abs(hash(str(tmp_path)))}"
    spec = importlib.util.spec_from_file_location(name, folder / "dropin.py")
    mod = importlib.util.module_from_spec(spec)
    sys.modules[name] = mod
    spec.loader.exec_module(mod)
    yield mod
    sys.modules.pop(name, None)


def test_the_cache_is_a_private_per_user_directory_keyed_by_the_full_sha256(dropin, tmp_path):
    lib = dropin._compile()
    root = tmp_path / "xdg" / "fusebot" / "dropin"
    assert lib.parent.parent == root and len(lib.parent.name) == 64
    assert stat.S_IMODE(root.stat().st_mode) == 0o700 and root.stat().st_uid == os.getuid()
    assert stat.S_IMODE(lib.parent.stat().st_mode) == 0o700
    assert dropin._compile() == lib  # cached


def test_a_cache_others_can_write_to_is_refused(dropin, tmp_path):
    root = tmp_path / "xdg" / "fusebot" / "dropin"
    root.mkdir(parents=True)
    root.chmod(0o777)
    with pytest.raises(dropin.BuildError, match="not private"):
        dropin._compile()


def test_a_cache_that_is_a_symlink_is_refused(dropin, tmp_path):
    (tmp_path / "xdg" / "fusebot").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir(mode=0o700)
    (tmp_path / "xdg" / "fusebot" / "dropin").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(dropin.BuildError, match="not private"):
        dropin._compile()


@pytest.mark.skipif(os.getuid() != 0, reason="giving a directory to another user needs root")
def test_a_cache_owned_by_another_user_is_refused(dropin, tmp_path):
    root = tmp_path / "xdg" / "fusebot" / "dropin"
    root.mkdir(parents=True, mode=0o700)
    os.chown(root, 12345, 12345)
    with pytest.raises(dropin.BuildError, match="not private"):
        dropin._compile()


def test_a_planted_or_altered_library_is_rebuilt_not_loaded(dropin):
    lib = dropin._compile()
    good = lib.read_bytes()
    lib.write_bytes(b"\x7fELF planted by someone else")
    assert not dropin._intact(lib)
    assert dropin._compile() == lib and lib.read_bytes() == good  # rebuilt over it
    (lib.parent / "kernel.so.sha256").unlink()
    assert not dropin._intact(lib)


def test_the_key_names_the_cpu_it_was_built_for(dropin, monkeypatch):
    first = dropin._compile()
    monkeypatch.setattr(dropin, "_cpu_model", lambda: "model name\t: Another CPU")
    assert dropin._compile().parent != first.parent
