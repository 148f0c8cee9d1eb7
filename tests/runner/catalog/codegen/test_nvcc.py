"""The one-unit compile check names the sources that fail: by the front end's line, or by compiling halves where
the error is in the PTX and names no source."""

from __future__ import annotations

import shutil

import pytest

from tests.runner.catalog.codegen.nvcc import compile_together, failing_sources, one_unit

GOOD = "__global__ void k(float* x) { x[0] = 1.f; }\n"
BAD_FRONT = "__global__ void k(float* x) { x[0] = undeclared_name; }\n"
BAD_PTX = '__global__ void k(float* x) { asm volatile("bogus.op.f32 %0;" :: "f"(x[0])); }\n'


def test_a_front_end_error_is_blamed_on_the_source_whose_lines_it_names():
    sources = [GOOD, BAD_FRONT, GOOD]
    unit = one_unit(sources)
    line = next(n for n, text in enumerate(unit.splitlines(), 1) if "undeclared_name" in text)
    log = f'all.cu({line}): error: identifier "undeclared_name" is undefined\n1 error detected\n'
    assert failing_sources(unit, log) == [1]
    assert failing_sources(unit, "ptxas fatal   : Ptx assembly aborted due to errors\n") == []


@pytest.mark.slow
@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_failing_unit_names_its_failing_sources(tmp_path):
    rc, log = compile_together([GOOD, BAD_FRONT, GOOD], tmp_path / "front", names=["a", "b", "c"])
    assert rc != 0 and log.startswith("failed: b\n") and "undeclared_name" in log, log
    rc, log = compile_together([BAD_PTX, GOOD], tmp_path / "ptx", names=["a", "b"])  # ptxas names no source
    assert rc != 0 and log.startswith("failed: a\n") and "bogus" in log, log
