"""FILE[:CLASS]: a marked class needs no CLASS, several need one and are listed, KernelBench files still work, and a
mistake is a usage error naming the file (and line) and the fix. End to end: `fusebot optimize` on a file marking
several classes stops with the list (exit 2), and `fusebot eval` verifies a marked class against a candidate."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from runner.cli.target import parse_target, problem_for
from runner.errors import UsageError
from tests.session_env import session_env

ROOT = Path(__file__).resolve().parents[3]
PROBLEMS = ROOT / "tests/fixtures/problems"

TWO_MARKED = '''import torch
import torch.nn as nn


# fusebot: optimize
class Scale(nn.Module):
    def forward(self, x):
        return x * 2


class Helper(nn.Module):
    def forward(self, x):
        return x


# fusebot: optimize
class Shift(nn.Module):
    def forward(self, x):
        return x + 1


def get_inputs():
    return [torch.randn(8, 8)]


def get_init_inputs():
    return []
'''


def test_a_file_with_one_marked_class_needs_no_class():
    spec = problem_for(str(ROOT / "examples/row_gain.py"))
    assert (spec.class_name, spec.name, spec.second_inputs) == ("RowGain", "RowGain", "get_second_inputs")
    assert spec.path == str((ROOT / "examples/row_gain.py").resolve())


def test_a_kernelbench_file_is_its_model():
    spec = problem_for(str(PROBLEMS / "scale_relu.py"))
    assert (spec.class_name, spec.name) == ("Model", "scale_relu")
    assert problem_for(f"{PROBLEMS / 'scale_relu.py'}:Model") == spec


def test_several_marked_classes_are_listed_and_file_class_picks_one(tmp_path):
    f = tmp_path / "layers.py"
    f.write_text(TWO_MARKED)
    with pytest.raises(UsageError) as e:
        problem_for(str(f))
    assert str(e.value) == f"{f} marks 2 classes `# fusebot: optimize`; name one: {f}:Scale, {f}:Shift"
    assert problem_for(f"{f}:Shift").class_name == "Shift"
    assert problem_for(f"{f}:Helper").class_name == "Helper"  # any class of the file, marked or not
    with pytest.raises(UsageError, match=rf"defines no class 'Nope'; it defines {f}:Scale, {f}:Helper, {f}:Shift"):
        problem_for(f"{f}:Nope")


def test_mistakes_name_the_file_line_and_fix(tmp_path):
    with pytest.raises(UsageError, match="no such file"):
        problem_for(str(tmp_path / "nope.py"))
    broken = tmp_path / "broken.py"
    broken.write_text("class A:\n    def f(self:\n")
    with pytest.raises(UsageError, match=rf"^{broken}:2: syntax error"):
        problem_for(str(broken))
    bare = tmp_path / "bare.py"
    bare.write_text("import torch\n\n\n# fusebot: optimize\nclass A(torch.nn.Module):\n    pass\n")
    with pytest.raises(UsageError, match=rf"^{bare}:5: A needs example inputs: define get_inputs\(\)"):
        problem_for(str(bare))
    plain = tmp_path / "plain.py"
    plain.write_text("class A:\n    pass\n")
    with pytest.raises(UsageError, match=rf"no class marked .* and no class 'Model'; name one as FILE:CLASS "
                                         rf"\(it defines {plain}:A\)"):
        problem_for(str(plain))
    with pytest.raises(UsageError, match="not a class name"):
        parse_target(f"{plain}:3x")


def test_optimize_on_a_file_marking_several_classes_lists_them_and_exits_2(tmp_path):
    f = tmp_path / "layers.py"
    f.write_text(TWO_MARKED)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOT_")}
    p = subprocess.run([sys.executable, "-m", "bot.cli", "optimize", str(f), "--out", str(tmp_path / "o"),
                        "--backend", "cpu"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 2, p.stderr
    assert p.stderr == f"error: {f} marks 2 classes `# fusebot: optimize`; name one: {f}:Scale, {f}:Shift\n"
    assert p.stdout == "" and not (tmp_path / "o").exists()


def test_eval_takes_a_marked_class_as_its_reference(tmp_path):
    """scale_relu's reference as a marked class of a module (no class Model), against the C++ kernel that passes it
    as a KernelBench problem."""
    text = (PROBLEMS / "scale_relu.py").read_text().replace("class Model(", "# fusebot: optimize\nclass ScaleReLU(")
    assert "# fusebot: optimize\nclass ScaleReLU(" in text
    module = tmp_path / "layers.py"
    module.write_text(text)
    env = {k: v for k, v in os.environ.items() if not k.startswith("FUSEBOT_")} | session_env() | {
        "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"}
    p = subprocess.run([sys.executable, "-m", "bot.cli", "eval", str(module), str(ROOT / "tests/fixtures/candidates/"
                        "scale_relu_ok.cpp"), "--no-compile"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=600)
    assert p.returncode == 0, p.stdout + p.stderr
    assert p.stdout.startswith("correct, ") and "problem ScaleReLU" in p.stdout.splitlines()[0]
