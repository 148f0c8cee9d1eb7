"""The generated test of a drop-in (runner/results/dropin_test.py), run against real drop-ins: it passes for a right
one and catches a wrong kernel (test_dropin.py), a layout other than the original's, and a kernel that runs where it
was switched off."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

from runner.contract import ProblemSpec
from runner.results.dropin_test import dropin_test_source
from tests.runner.harness.test_dropin import KERNEL, SPEC2, write_folder
from tests.runner.harness.test_dropin_guard import KERNEL_T, TRANSPOSED


def run(folder, tmp_path):
    env = {"FUSEBOT_DROPIN_CACHE": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", str(folder)], cwd=folder,
                          env=env, capture_output=True, text=True, timeout=300)


def test_the_generated_test_checks_the_output_layout(tmp_path):
    spec = SPEC2.model_copy(update={"second_inputs": None})
    folder = write_folder(tmp_path / "t", KERNEL_T, spec, ship=True, reference=TRANSPOSED)
    good = run(folder, tmp_path)
    assert good.returncode == 0 and "5 passed" in good.stdout, good.stdout + good.stderr
    dropin = folder / "dropin.py"
    text = dropin.read_text()
    layout = "and _dense(shape, stride)]"  # the outputs a call signature lays out as the original's (call.py)
    assert layout in text
    dropin.write_text(text.replace(layout, "and False]"))  # contiguous outputs, as before
    bad = run(folder, tmp_path)
    assert bad.returncode == 1 and "3 failed" in bad.stdout and "the original's (1, 256)" in bad.stdout


def test_the_generated_test_checks_the_switches(tmp_path):
    folder = write_folder(tmp_path / "t", KERNEL, SPEC2, ship=True)
    dropin = folder / "dropin.py"
    dropin.write_text(dropin.read_text().replace("if not module.fusebot_enabled or _env_off(", "if False and ("))
    out = run(folder, tmp_path)
    assert out.returncode == 1 and "switched off, the kernel still ran" in out.stdout, out.stdout


def test_the_generated_test_names_what_it_checks():
    src = dropin_test_source(ProblemSpec(name="gelu", module="pkg.layers", class_name="NewGELU", dtype="float64"),
                             "cpu")
    compile(src, "test_gelu.py", "exec")
    assert "CLASS = 'NewGELU'" in src and "getattr(dropin, CLASS).kernel_calls" in src
    assert "FUSEBOT_DISABLE" in src and "FallbackWarning" in src
    assert "other = torch.float32 if (DTYPE or torch.float32) == torch.float64 else torch.float64" in src
    assert "dropin._shipped(arch) is not None" in src
    cuda = dropin_test_source(ProblemSpec(name="gelu", module="pkg.layers", class_name="NewGELU"), "cuda")
    compile(cuda, "test_gelu.py", "exec")
    assert "with torch.cuda.graph(graph):" in cuda and "graph.replay()" in cuda  # the capture a PR's body states
    assert "the kernel was not captured (the original forward ran)" in cuda


def _generated_assert_close(problem: ProblemSpec):
    """The generated test's comparison, executed on its own (the module's fixtures need a drop-in beside it)."""
    namespace: dict = {}
    exec(compile(dropin_test_source(problem, "cpu"), "test_t.py", "exec"), namespace)  # noqa: S102 - our own source
    return namespace["_assert_close"]


def test_each_output_is_compared_at_its_own_dtype_s_tolerance_unless_the_problem_sets_one():
    """A module that computes in float32 and returns bf16 (Llama's softmax, `.to(query.dtype)`): a kernel one bf16
    step away from eager is within bf16's tolerance, as the harness judged it, though the problem sets no dtype.
    Before, the test took float32's tolerance for such a problem and failed a verified kernel."""
    want = torch.linspace(0.1, 1.0, 64).to(torch.bfloat16)
    one_step = want + torch.finfo(torch.bfloat16).eps * want  # the next representable bf16 value, or about
    close = _generated_assert_close(ProblemSpec(name="t", module="m", class_name="M"))
    close(one_step, want)
    close((want.float(), one_step), (want.float(), want))
    with pytest.raises(AssertionError):
        close(want * 1.1, want)
    with pytest.raises(AssertionError):  # float32 outputs keep float32's
        close(want.float() * (1 + 1e-3), want.float())
    strict = _generated_assert_close(ProblemSpec(name="t", module="m", class_name="M", atol=1e-5, rtol=1e-5))
    with pytest.raises(AssertionError):  # the problem's own tolerance wins
        strict(one_step, want)
