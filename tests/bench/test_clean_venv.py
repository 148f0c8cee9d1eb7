"""bench/clean_venv.py: a virtualenv of the named distributions' requirement closure and nothing else, in which
they import and fusebot does not."""

from __future__ import annotations

import subprocess

import bench.clean_venv as clean


def test_the_closure_holds_the_requirements_and_nothing_else():
    found = clean.closure(["pytest"])
    assert {"pytest", "pluggy", "iniconfig", "packaging"} <= set(found)
    assert "torch" not in found and "fusebot" not in found


def test_in_the_venv_pytest_imports_and_fusebot_does_not(tmp_path):
    linked = clean.make(tmp_path / "venv", ["pytest"])
    assert "pytest" in linked
    probe = ("import importlib.util, pytest\n"
             "print([n for n in ('runner', 'bot', 'torch') if importlib.util.find_spec(n)])")
    done = subprocess.run([str(tmp_path / "venv/bin/python"), "-c", probe], cwd=tmp_path, capture_output=True,
                          text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"
