"""The drop-in's test module: pytest source comparing the drop-in with the original module over several seeds and
every declared shape (values and the output's layout), its guard (another dtype calls the original, with a warning),
its switches (FUSEBOT_DISABLE, `fusebot_enabled`), the shipped library being what runs where it fits, for a CUDA
kernel its capture and replay in a CUDA graph, and gradients (which the original forward computes). Skipped without
CUDA for a CUDA kernel. Pure: problem in, text out; the test itself is runner/shipped/dropin_tests.py."""

from __future__ import annotations

from runner import shipped
from runner.contract import DEFAULT_TOLERANCE, ProblemSpec

TEST_FILE = "test_dropin.py"
DEFAULT_SEEDS = 3


def dropin_test_source(problem: ProblemSpec, backend: str, seeds: int = DEFAULT_SEEDS) -> str:
    """A pytest module comparing the drop-in with the original over several seeds and every declared shape, forward
    and gradients, with its guard, switches and shipped library (skipped without CUDA for a CUDA kernel): the module
    runner/shipped/dropin_tests.py with this problem's values."""
    shapes = [problem.inputs] + ([problem.second_inputs] if problem.second_inputs else [])
    doc = f"The fused drop-in for {problem.name} against the original {problem.class_name}, by fusebot."
    return shipped.render("dropin_tests", doc, {
        "TARGET": problem.name, "CLASS": problem.class_name, "DEVICE": "cuda" if backend == "cuda" else "cpu",
        "DTYPE_NAME": problem.dtype, "ATOL": problem.atol, "RTOL": problem.rtol,
        "TOLERANCE": dict(DEFAULT_TOLERANCE),  # each output at its dtype's, unless the problem sets its own
        "SHAPES": shapes, "INIT_INPUTS": problem.init_inputs,
        "INIT_ARGS": list(problem.init_args), "INIT_KWARGS": dict(problem.init_kwargs), "SEEDS": seeds})
