"""Capture (torch.fx in a confined child process, fake tensors) and pattern recognition over small KernelBench-style
problems: each must land in the right family with the right iteration space, reduced dims and shortcuts."""

from __future__ import annotations

from pathlib import Path

import pytest

from runner.catalog.capture import capture_sources
from runner.catalog.ir import Const, Load, Op, Red, reductions
from runner.catalog.recognition import recognise
from tests.runner.catalog.captures import keep

CATALOG = Path(__file__).resolve().parents[2] / "fixtures/problems/catalog"
NAMES = sorted(p.stem for p in CATALOG.glob("*.py"))

UNTRACEABLE = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def forward(self, x):
        if x.sum() > 0:  # data-dependent control flow: neither fx nor export can capture it
            return x * 2
        return x - 1

def get_inputs():
    return [torch.randn(8, 8)]

def get_init_inputs():
    return []
'''

BROKEN = "import torch\nraise RuntimeError('this problem does not import')\n"

BIG_LAYERNORM = '''
import torch
import torch.nn as nn

class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln = nn.LayerNorm((64, 256, 256))

    def forward(self, x):
        return self.ln(x)

def get_inputs():
    return [torch.randn(16, 64, 256, 256)]  # 4 GiB if it were real

def get_init_inputs():
    return []
'''


@pytest.fixture(scope="module")
def patterns():
    """Every fixture problem and three special sources, captured in one child process (torch imported once)."""
    sources = [(CATALOG / f"{n}.py").read_text() for n in NAMES] + [UNTRACEABLE, BROKEN, BIG_LAYERNORM]
    graphs = capture_sources(sources)
    keep(sources, graphs)  # (the other files of the run read them: tests/runner/catalog/captures.py)
    names = [*NAMES, "untraceable", "broken", "big_layernorm"]
    return {n: (g, recognise(g)) for n, g in zip(names, graphs, strict=True)}


# name -> (family, F, reduced dims, reduction kinds, a phrase the notes must contain)
EXPECTED = {
    "argmax": ("row", (64, 300), (1,), {"argmax"}, "argmax"),
    "argmax_middle": ("row", (6, 96, 45), (1,), {"argmax"}, "argmax"),
    "mean_middle": ("row", (5, 128, 63), (1,), {"mean"}, "mean over dims [1]"),
    "batchnorm_eval": ("elementwise", (4, 6, 10, 8), (), set(), "batch norm with running statistics"),
    "channel_affine": ("elementwise", (4, 8, 6, 10), (), set(), ""),
    "diag_matmul": ("elementwise", (256, 80), (), set(), "diag(a) @ B is a broadcast multiply"),
    "ew_broadcast": ("elementwise", (48, 96), (), set(), ""),
    "frobenius": ("row", (16, 32, 20), (0, 1, 2), {"sum"}, "Frobenius"),
    "gemm_to_constant": ("elementwise", (16, 1), (), set(), "no linear needed"),
    "gemm_groupnorm": ("epilogue", (48, 8, 32, 1), (2, 3), {"mean", "var"}, "group norm (8 groups)"),
    "groupnorm": ("row", (4, 3, 4, 63), (2, 3), {"mean", "var"}, "group norm (3 groups)"),
    "groupnorm_runs": ("row", (6, 4, 4, 240), (2, 3), {"mean", "var"}, "group norm (4 groups)"),
    "hinge_loss": ("row", (512, 2048), (0, 1), {"mean"}, "mean over dims [0, 1]"),
    "hinge_rows": ("row", (24, 40, 256), (1, 2), {"mean"}, "mean over dims [1, 2]"),
    "huber_loss": ("row", (96, 64), (0, 1), {"mean"}, "mean over dims [0, 1]"),
    "identity_softmax": ("elementwise", (256, 1, 32), (), set(), "the identity"),
    "instancenorm": ("row", (4, 8, 20, 24), (2, 3), {"mean", "var"}, "instance norm"),
    "layernorm": ("row", (12, 16, 40), (1, 2), {"mean", "var"}, "layer norm"),
    "linear_epilogue": ("epilogue", (64, 96), (), set(), "linear stays on torch"),
    "log_softmax": ("row", (32, 777), (1,), {"lse"}, "log_softmax"),
    "logsumexp_max": ("row", (40, 200), (1,), {"lse", "max"}, "lse"),
    "matmul_t_rowsum": ("epilogue", (48, 80), (1,), {"sum"}, "matmul stays on torch"),
    "mingpt_gelu": ("elementwise", (128, 512), (), set(), "minGPT"),
    "mse_loss": ("row", (128, 64), (0, 1), {"mean"}, "mean over dims [0, 1]"),
    "prod_dim": ("row", (32, 64), (1,), {"prod"}, "prod over dims [1]"),
    "rmsnorm": ("row", (4, 24, 10, 12), (1,), {"mean"}, "RMS norm"),
    "softmax": ("row", (64, 1000), (1,), {"lse"}, "softmax"),
    "softmax_long_rows": ("row", (300, 50000), (1,), {"lse"}, "softmax"),
    "rowsum_identities": ("row", (32, 100), (1,), {"sum"}, "over dims of size 1 is the identity"),
    "sum_dim": ("row", (8, 96, 40), (1,), {"sum"}, "sum over dims [1]"),
}


def test_every_fixture_has_an_expectation():
    assert sorted(EXPECTED) == NAMES


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_fixture_is_recognised_as_its_family(patterns, name):
    g, pat = patterns[name]
    family, shape, axes, kinds, phrase = EXPECTED[name]
    assert g.tracer == "export" and g.unsupported is None
    assert pat.family == family, pat.reason
    prog = pat.program
    assert prog.shape == shape and prog.axes == axes
    assert {r.kind for r in reductions(prog.out)} == kinds
    assert phrase in " ".join(pat.notes), pat.notes


def test_broadcast_inputs_are_classified(patterns):
    prog = patterns["ew_broadcast"][1].program
    # x [48, 96] full, w [96] (a parameter, after the forward's 3 inputs), b [48, 1], z [96]
    by_abi = {inp.abi: prog.access(k) for k, inp in enumerate(prog.inputs)}
    assert by_abi == {0: "full", 3: "general", 1: "general", 2: "general"}
    assert [inp.abi for inp in prog.inputs] == [0, 3, 1, 2]  # loads in order of first use


def test_layernorm_weights_index_along_the_row(patterns):
    prog = patterns["layernorm"][1].program
    kinds = sorted(prog.access(k) for k in range(len(prog.inputs)))
    assert kinds == ["full", "rowvec", "rowvec"]


def test_identity_shortcuts_fold_to_a_constant(patterns):
    prog = patterns["identity_softmax"][1].program
    assert prog.out == Const(1.0) and prog.inputs == []  # softmax over a dim of size 1, dropout off, x * 1.0


def test_a_gemm_that_cancels_leaves_a_constant(patterns):
    prog = patterns["gemm_to_constant"][1].program
    assert prog.out == Const(0.0) and prog.inputs == []


def test_diag_matmul_reads_the_vector_as_a_column(patterns):
    prog = patterns["diag_matmul"][1].program
    assert isinstance(prog.out, Op) and prog.out.name == "mul"
    assert sorted(inp.shape for inp in prog.inputs) == [(256, 1), (256, 80)]


def test_epilogue_keeps_the_linear_on_torch(patterns):
    pat = patterns["linear_epilogue"][1]
    assert pat.heavy.op == "linear" and pat.heavy.call_args == [{"abi": 0}, {"abi": 2}, {"abi": 3}]
    heavy_inputs = [inp for inp in pat.program.inputs if inp.abi == -1]
    assert len(heavy_inputs) == 1 and heavy_inputs[0].shape == (64, 96)


def test_a_transposed_weight_goes_to_the_gemm(patterns):
    pat = patterns["matmul_t_rowsum"][1]
    assert pat.heavy.op == "matmul" and pat.heavy.call_args == [{"abi": 0}, {"abi": 1, "t": True}]
    assert pat.program.level(pat.program.out) == "row"


def test_rmsnorm_divides_by_a_per_row_value(patterns):
    prog = patterns["rmsnorm"][1].program
    assert prog.split() == (4, 24, 120) and prog.level(prog.out) == "full"
    (red,) = reductions(prog.out)
    assert isinstance(red, Red) and red.arg == Op("square", (Load(0),))


def test_untraceable_problem_is_unsupported_with_the_tracers_reasons(patterns):
    g, pat = patterns["untraceable"]
    assert pat.family == "unsupported"
    assert "torch.export" in g.unsupported


def test_broken_problem_is_unsupported_not_an_exception(patterns):
    g, pat = patterns["broken"]
    assert pat.family == "unsupported" and "does not import" in g.unsupported


def test_large_shapes_are_captured_with_fake_tensors(patterns):
    g, pat = patterns["big_layernorm"]
    assert g.node("x").shape == [16, 64, 256, 256]
    assert pat.family == "row" and pat.program.split() == (16, 64 * 256 * 256, 1)
