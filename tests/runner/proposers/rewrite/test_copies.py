"""Copies nothing needs (runner/proposers/rewrite/copies.py): removed before ops that read any layout and return a
new tensor, kept where the layout or the copy matters."""

from __future__ import annotations

import pytest

from runner.proposers.rewrite.proposer import rewrites

from .test_rules import X3, changed, equivalent, module


@pytest.mark.parametrize("expr, new", [
    ("x.transpose(1, 2).contiguous() @ x", "x.transpose(1, 2) @ x"),
    ("torch.matmul(x, x.transpose(1, 2).contiguous())", "torch.matmul(x, x.transpose(1, 2))"),
    ("self.fc(x.transpose(1, 2).contiguous())", "self.fc(x.transpose(1, 2))"),
    ("F.linear(x.transpose(1, 2).contiguous(), self.w2)", "F.linear(x.transpose(1, 2), self.w2)"),
    ("x.transpose(1, 2).contiguous().softmax(-1)", "x.transpose(1, 2).softmax(-1)"),
    ("torch.softmax(x.transpose(1, 2).contiguous(), dim=-1)", "torch.softmax(x.transpose(1, 2), dim=-1)"),
])
def test_contiguous_before_a_layout_free_op_goes(expr, new):
    text = module(f"return {expr}")
    r = equivalent(text, [X3[0].reshape(2, 8, 5)] if "fc" in expr or "linear" in expr else X3)  # (transposed: 8 last)
    assert changed(text, r.text) == ([f"return {expr}"], [f"return {new}"])
    assert r.sites[0].rule == "contiguous"


@pytest.mark.parametrize("expr", [
    "x.transpose(1, 2).contiguous().view(2, -1)",  # view needs the copy
    "x.transpose(1, 2).contiguous() * 2",  # an elementwise result keeps its input's layout
    "x.transpose(1, 2).contiguous()",  # the output itself
])
def test_contiguous_that_matters_stays(expr):
    assert rewrites(module(f"return {expr}"), "Model") == []


@pytest.mark.parametrize("expr, new", [
    ("x.clone() * 2", "x * 2"),
    ("torch.cat([x.clone(), x], dim=0)", "torch.cat([x, x], dim=0)"),
    ("x.clone().sum(-1)", "x.sum(-1)"),
])
def test_a_clone_only_read_goes(expr, new):
    text = module(f"return {expr}")
    r = equivalent(text, X3)
    assert changed(text, r.text) == ([f"return {expr}"], [f"return {new}"])


def test_a_named_clone_nothing_writes_goes():
    text = module("y = x.clone()\nreturn torch.softmax(y, dim=-1) + y * 2")
    r = equivalent(text, X3)
    assert changed(text, r.text) == (["y = x.clone()"], ["y = x"])


@pytest.mark.parametrize("body", [
    "return x.clone()",  # the output would alias the input
    "y = x.clone()\ny[0] = 0\nreturn y",  # the copy is written
    "y = x.clone()\nreturn y",  # the copy is the output
    "y = x.clone()\nx.add_(1)\nreturn y * 2",  # the original is written after the copy
    "y = x.clone()\nz = self.fc(x)\nreturn y * z",  # a module may write its input (an in-place activation)
    "return F.relu(x.clone(), inplace=True)",  # written in place
])
def test_a_clone_that_matters_stays(body):
    assert rewrites(module(body), "Model") == []


def test_a_conversion_twice_is_once():
    text = module("return x.float().float() + x.to(torch.float64).to(torch.float64).float()")
    assert len(rewrites(text, "Model")) == 3  # both together, then each alone
    r = equivalent(text, X3)
    assert changed(text, r.text)[1] == ["return x.float() + x.to(torch.float64).float()"]
    assert rewrites(module("return x.float().half()"), "Model") == []
