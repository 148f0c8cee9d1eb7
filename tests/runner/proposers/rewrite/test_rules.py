"""The algebraic and library rewrites (runner/proposers/rewrite/rules.py): each rule where it is equivalent, checked
by running the module before and after on the same parameters, and left alone where it is not."""

from __future__ import annotations

import ast
import difflib
import textwrap
import types

import pytest
import torch

from runner.proposers.rewrite.proposer import Rewrite, rewrites

HEAD = """import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class Model(nn.Module):
    def __init__(self, dim=8):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(dim) + 0.5)
        self.square = nn.Parameter(torch.rand(dim, dim))
        self.weight = nn.Parameter(torch.rand(dim) + 0.5)
        self.bias = nn.Parameter(torch.randn(dim))
        self.w2 = nn.Parameter(torch.randn(dim, dim))
        self.eps = 1e-5
        self.fc = nn.Linear(dim, dim)

"""


def module(forward: str, args: str = "x") -> str:
    """A module file whose Model.forward(self, <args>) has this body."""
    return HEAD + f"    def forward(self, {args}):\n" + textwrap.indent(textwrap.dedent(forward).strip("\n"), " " * 8) \
        + "\n"


def load(text: str, name: str = "Model") -> type:
    mod = types.ModuleType("rewrite_test_module")
    exec(compile(text, "<rewrite-test>", "exec"), mod.__dict__)  # noqa: S102 - the test's own source
    return getattr(mod, name)


def outputs(text: str, inputs: list, name: str = "Model") -> torch.Tensor:
    torch.manual_seed(0)
    model = load(text, name)()
    with torch.no_grad():
        return model(*[x.clone() for x in inputs])


def changed(old: str, new: str) -> tuple[list[str], list[str]]:
    """(the lines a rewrite removed, the lines it added), stripped."""
    diff = list(difflib.ndiff(old.splitlines(), new.splitlines()))
    return [d[2:].strip() for d in diff if d[:2] == "- "], [d[2:].strip() for d in diff if d[:2] == "+ "]


def one(text: str, name: str = "Model") -> Rewrite:
    found = rewrites(text, name)
    assert found, "no rewrite found"
    return found[0]


def equivalent(text: str, inputs: list, atol: float = 1e-5) -> Rewrite:
    """The first rewrite of the module, checked to compute what the module computes."""
    r = one(text)
    torch.testing.assert_close(outputs(r.text, inputs), outputs(text, inputs), atol=atol, rtol=1e-5)
    return r


X = [torch.randn(8, 6)]
X3 = [torch.randn(2, 5, 8)]


# ---- diag products ---------------------------------------------------------------------------------------------

def rows_guard(b: str, v: str) -> str:
    """The diag rewrite's guard: where the matmul takes B and the multiply would not broadcast or promote it."""
    return f"{b}.dim() >= 2 and {b}.shape[-2] == {v}.shape[0] and ({b}.dtype == {v}.dtype)"


def cols_guard(a: str, v: str) -> str:
    return f"{a}.dim() >= 1 and {a}.shape[-1] == {v}.shape[0] and ({a}.dtype == {v}.dtype)"


def test_diag_matmul_is_a_broadcast_multiply_where_the_matmul_takes_its_operand():
    """Guarded whatever the source's shape comment says: a 1-D x (an outer product), an x of one row (a broadcast)
    or of another dtype (a promotion) runs the original, which refuses them; the values' precondition is stated."""
    text = module("# x: [N, M]\nreturn torch.diag(self.gain) @ x")
    r = equivalent(text, X)
    assert changed(text, r.text) == (["return torch.diag(self.gain) @ x"], [
        f"return self.gain[:, None] * x if {rows_guard('x', 'self.gain')} else torch.diag(self.gain) @ x"])
    assert r.sites[0].rule == "diag-product" and "broadcast multiply" in r.idea()
    assert r.sites[0].precondition.startswith("`x` holds no inf or NaN")
    for x in (torch.randn(8), torch.randn(1, 6), torch.randn(8, 6, dtype=torch.float64)):
        try:
            want = outputs(text, [x])
        except RuntimeError:
            with pytest.raises(RuntimeError):
                outputs(r.text, [x])
        else:
            got = outputs(r.text, [x])
            assert got.shape == want.shape and got.dtype == want.dtype
            torch.testing.assert_close(got, want)


@pytest.mark.parametrize("expr, new", [
    ("torch.mm(torch.diag(self.gain), x)", "self.gain[:, None] * x if {rows} else torch.mm(torch.diag(self.gain), x)"),
    ("torch.matmul(torch.diag(self.gain), x)",
     "self.gain[:, None] * x if {rows} else torch.matmul(torch.diag(self.gain), x)"),
    ("torch.diag(self.gain).matmul(x)", "self.gain[:, None] * x if {rows} else torch.diag(self.gain).matmul(x)"),
    ("x.t() @ torch.diag(self.gain)", "x.t() * self.gain if {cols} else x.t() @ torch.diag(self.gain)"),
    ("torch.mm(x.t(), torch.diag(self.gain))", "x.t() * self.gain if {cols} else torch.mm(x.t(), torch.diag(self.gain))"),
])
def test_every_spelling_of_a_diag_product(expr, new):
    text = module(f"# x: [N, M]\nreturn {expr}")
    r = equivalent(text, X)
    new = new.format(rows=rows_guard("x", "self.gain"), cols=cols_guard("x.t()", "self.gain"))
    assert changed(text, r.text) == ([f"return {expr}"], [f"return {new}"])


def test_a_batch_of_diagonals():
    g = [torch.randn(2, 5, 8), torch.rand(2, 5)]
    text = module("# x: [B, N, M]\nreturn torch.diag_embed(g) @ x + (x.mT @ torch.diag_embed(g)).mT", args="x, g")
    r = equivalent(text, g)
    assert changed(text, r.text)[1] == ["return g.unsqueeze(-1) * x + (x.mT * g.unsqueeze(-2)).mT"]
    assert r.idea().count("line 21: ") == 2  # both sites


def test_a_diag_of_a_matrix_is_not_rewritten():
    """torch.diag of a 2-D tensor is its diagonal (a vector): diag(W) @ x is a matrix-vector product."""
    assert rewrites(module("# x: [N, M]\nreturn torch.diag(self.square) @ x"), "Model") == []


def test_unknown_dims_are_guarded():
    text = module("return torch.diag(g) @ x", args="x, g")
    r = one(text)
    (line,) = changed(text, r.text)[1]
    want = f"return g[:, None] * x if g.dim() == 1 and {rows_guard('x', 'g')} else torch.diag(g) @ x"
    assert ast.dump(ast.parse(line)) == ast.dump(ast.parse(want)), line  # the same code, whatever its parentheses
    assert "guarded" in r.idea()
    for x, g in ((torch.randn(8, 6), torch.rand(8)), (torch.randn(8), torch.rand(8)), (torch.randn(8, 6),
                                                                                        torch.rand(8, 8))):
        torch.testing.assert_close(outputs(r.text, [x, g]), outputs(text, [x, g]))


def test_a_temporary_diag_stays_for_the_guards_other_branch():
    text = module("# x: [N, M]\nd = torch.diag(self.gain)\nreturn d @ x")
    r = equivalent(text, X)
    assert changed(text, r.text) == (["return d @ x"],
                                     [f"return self.gain[:, None] * x if {rows_guard('x', 'self.gain')} else d @ x"])


def test_a_temporary_read_elsewhere_stays():
    text = module("# x: [N, M]\nd = torch.diag(self.gain)\nreturn d @ x + d.sum()")
    r = equivalent(text, X)
    assert changed(text, r.text) == (["return d @ x + d.sum()"], [
        f"return (self.gain[:, None] * x if {rows_guard('x', 'self.gain')} else d @ x) + d.sum()"])


# ---- softmax, log-softmax --------------------------------------------------------------------------------------

@pytest.mark.parametrize("body", [
    "return torch.exp(x - x.max(dim=-1, keepdim=True)[0]) / torch.exp(x - x.max(dim=-1, keepdim=True)[0])"
    ".sum(dim=-1, keepdim=True)",
    "e = torch.exp(x - torch.amax(x, -1, keepdim=True))\nreturn e / e.sum(-1, keepdim=True)",
    "m = x.max(-1, keepdim=True).values.detach()\ne = (x - m).exp()\nreturn e / torch.sum(e, dim=-1, keepdim=True)",
    "return torch.exp(x) / torch.exp(x).sum(-1, keepdim=True)",
])
def test_a_softmax_written_out(body):
    text = module(body)
    r = equivalent(text, X3)
    assert changed(text, r.text) == (body.splitlines(), ["return torch.softmax(x, dim=-1)"])  # temporaries gone


@pytest.mark.parametrize("body", [
    "e = torch.exp(x - x.max(dim=-1, keepdim=True)[0])\nreturn e / e.sum(dim=1, keepdim=True)",  # another dim
    "e = torch.exp(x - x.max(dim=1, keepdim=True)[0])\nreturn e / e.sum(dim=-1, keepdim=True)",  # max elsewhere
    "e = torch.exp(x)\nreturn e / e.sum(dim=-1)",  # no keepdim: another broadcast
    "e = torch.exp(x)\nreturn e / x.sum(dim=-1, keepdim=True)",  # another denominator
])
def test_what_is_not_a_softmax_stays(body):
    assert rewrites(module(body), "Model") == []


def test_log_softmax():
    text = module("return x - torch.logsumexp(x, dim=-1, keepdim=True)")
    r = equivalent(text, X3)
    assert changed(text, r.text)[1] == ["return torch.log_softmax(x, dim=-1)"]
    assert rewrites(module("return x - torch.logsumexp(x, dim=1, keepdim=False)"), "Model") == []


# ---- norms, linear ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("body, new", [
    ("return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps) * self.weight",
     "return F.rms_norm(x, (x.shape[-1],), self.weight, self.eps)"),
    ("return self.weight * (x / torch.sqrt(torch.mean(x ** 2, dim=-1, keepdim=True) + 1e-6))",
     "return F.rms_norm(x, (x.shape[-1],), self.weight, 1e-06)"),
    ("variance = x.pow(2).mean(-1, keepdim=True)\nx = x * torch.rsqrt(variance + self.eps)\nreturn self.weight * x",
     "x = F.rms_norm(x, (x.shape[-1],), None, self.eps)"),
])
def test_rms_norm_written_out(body, new):
    text = module(body)
    r = equivalent(text, X3)
    assert new in changed(text, r.text)[1]


def test_an_rms_over_another_dim_stays():
    assert rewrites(module("return x * torch.rsqrt(x.pow(2).mean(1, keepdim=True) + self.eps)"), "Model") == []


@pytest.mark.parametrize("body, new", [
    ("u = x.mean(-1, keepdim=True)\ns = (x - u).pow(2).mean(-1, keepdim=True)\n"
     "return (x - u) / torch.sqrt(s + self.eps) * self.weight + self.bias",
     "return F.layer_norm(x, (x.shape[-1],), self.weight, self.bias, self.eps)"),
    ("mu = x.mean(dim=-1, keepdim=True)\nvar = x.var(dim=-1, keepdim=True, unbiased=False)\n"
     "return (x - mu) * torch.rsqrt(var + 1e-5)",
     "return F.layer_norm(x, (x.shape[-1],), None, None, 1e-05)"),
])
def test_layer_norm_written_out(body, new):
    text = module(body)
    r = equivalent(text, X3)
    assert changed(text, r.text) == (body.splitlines(), [new])  # its temporaries gone too


@pytest.mark.parametrize("body", [
    "mu = x.mean(dim=-1, keepdim=True)\nvar = x.var(dim=-1, keepdim=True)\nreturn (x - mu) * torch.rsqrt(var + 1e-5)",
    "u = x.mean(1, keepdim=True)\ns = (x - u).pow(2).mean(1, keepdim=True)\nreturn (x - u) / torch.sqrt(s + 1e-6)",
])
def test_an_unbiased_or_channel_norm_stays(body):
    """x.var() is unbiased by default (LayerNorm's is not); a norm over dim 1 is not F.layer_norm's last dims."""
    assert rewrites(module(body), "Model") == []


def test_matmul_plus_bias_is_linear():
    text = module("return x @ self.w2.t() + self.bias")
    r = equivalent(text, X3)
    assert changed(text, r.text)[1] == ["return F.linear(x, self.w2, self.bias)"]
    assert rewrites(module("return x @ self.gain.t() + self.bias"), "Model") == []  # a 1-D "weight"
