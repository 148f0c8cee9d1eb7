"""Hand-written activations to library calls, found by value (runner/proposers/rewrite/activations.py): every
spelling that computes the activation is rewritten, and nothing that only looks like one."""

from __future__ import annotations

import pytest

from runner.proposers.rewrite.proposer import rewrites

from .test_rules import X3, changed, equivalent, module


@pytest.mark.parametrize("expr, new", [
    ("x * torch.sigmoid(x)", 'F.silu(x)'),
    ("torch.sigmoid(x) * x", 'F.silu(x)'),
    ("x / (1 + torch.exp(-x))", 'F.silu(x)'),
    ("x.mul(x.sigmoid())", 'F.silu(x)'),
    ("0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * torch.pow(x, 3))))",
     'F.gelu(x, approximate="tanh")'),
    ("0.5 * x * (1.0 + torch.tanh(x * 0.7978845608 * (1.0 + 0.044715 * x * x)))", 'F.gelu(x, approximate="tanh")'),
    ("x * 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))", "F.gelu(x)"),
    ("x * torch.tanh(F.softplus(x))", "F.mish(x)"),
    ("x * F.relu6(x + 3) / 6", "F.hardswish(x)"),
    ("torch.max(x, torch.zeros_like(x))", "torch.relu(x)"),
    ("1 / (1 + torch.exp(-x))", "torch.sigmoid(x)"),
    ("torch.log(1 + torch.exp(x))", "F.softplus(x)"),
])
def test_a_hand_written_activation_is_the_library_call(expr, new):
    text = module(f"return {expr}")
    r = equivalent(text, X3, atol=1e-5)
    assert changed(text, r.text) == ([f"return {expr}"], [f"return {new}"])
    assert r.sites[0].rule == "activation"


def test_an_activation_built_over_two_statements():
    text = module("cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))\nreturn x * cdf")
    r = equivalent(text, X3)
    assert changed(text, r.text) == (["cdf = 0.5 * (1.0 + torch.erf(x / math.sqrt(2.0)))", "return x * cdf"],
                                     ["return F.gelu(x)"])


@pytest.mark.parametrize("expr", [
    "x * torch.sigmoid(1.702 * x)",  # QuickGELU: no library call computes it
    "x * torch.sigmoid(self.gain)",  # two tensors
    "torch.sigmoid(x)",  # already the library call
    "torch.exp(x)",
    "torch.sigmoid(2 * x)",  # a formula, but no library activation's
    "self.fc(x) * torch.sigmoid(self.fc(x))",  # a module call is not evaluated once for twice
    "torch.clamp(x, min=0)",  # one op either way
    "x * x.max(-1, keepdim=True)[0]",  # a reduction, not an elementwise maximum
])
def test_what_is_not_an_activation_stays(expr):
    assert rewrites(module(f"return {expr}"), "Model") == []


def test_the_file_without_a_functional_import_names_it_through_its_own_imports():
    text = module("return x * torch.sigmoid(x)").replace("import torch.nn.functional as F\n", "")
    assert changed(text, equivalent(text, X3).text)[1] == ["return nn.functional.silu(x)"]
    text = text.replace("import torch.nn as nn\n", "").replace("nn.", "torch.nn.")
    assert changed(text, equivalent(text, X3).text)[1] == ["return torch.nn.functional.silu(x)"]
