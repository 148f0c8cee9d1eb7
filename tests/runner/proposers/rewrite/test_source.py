"""What the source rewrites read (runner/proposers/rewrite/source.py): the functions a forward reaches in its file and
the dims the source shows; and that a rewrite keeps every other byte of the file."""

from __future__ import annotations

import textwrap

from runner.proposers.rewrite.proposer import rewrites
from runner.proposers.rewrite.source import Module

from .test_rules import changed

FILE = textwrap.dedent('''\
    """A user's module: comments, blank lines and odd spacing must survive a rewrite."""
    import torch
    from torch import nn
    from jaxtyping import Float


    def swish(x):   # a helper the forward calls
        return x * torch.sigmoid(x)


    def unused(x):
        return x * torch.sigmoid(x)


    class Inner(nn.Module):
        def forward(self, x):
            return x / (1 + torch.exp(-x))


    class Other(nn.Module):
        def forward(self, x):
            return x * torch.sigmoid(x)


    class Outer(nn.Module):
        def __init__(self, n: int):
            super().__init__()
            self.inner = Inner()
            self.table = nn.Parameter(torch.randn(n, 4))
            self.register_buffer("scale", torch.ones(n))

        def forward(self, x: Float[torch.Tensor, "b n"], y):
            B, N, C = y.shape
            z = y.view(B, N * C)
            h = swish(x)   # keep this comment
            return self.inner(h) + self.helper(h)  +  z.sum()

        def helper(self, h):
            return h.sigmoid() * h
''')


def test_the_forward_reaches_its_methods_helpers_and_submodules_in_the_file():
    mod = Module(FILE, "Outer")
    assert [f.node.name for f in mod.funcs] == ["swish", "forward", "forward", "helper"]
    assert [f.cls.name if f.cls else None for f in mod.funcs] == [None, "Inner", "Outer", "Outer"]
    assert Module(FILE, "Missing").funcs == []


def test_dims_from_constructors_unpacking_views_and_annotations():
    forward = next(f for f in Module(FILE, "Outer").funcs if f.node.name == "forward" and f.cls.name == "Outer")
    assert forward.dims["self.table"] == 2 and forward.dims["self.scale"] == 1
    assert forward.dims["x"] == 2  # jaxtyping's "b n"
    assert forward.dims["y"] == 3 and forward.dims["z"] == 2  # B, N, C = y.shape; y.view(B, N * C)
    assert "h" not in forward.dims


def test_a_rewrite_changes_only_its_expressions_and_keeps_every_other_byte():
    found = rewrites(FILE, "Outer")
    everything = found[0]
    assert [s.rule for s in everything.sites] == ["activation"] * 3
    removed, added = changed(FILE, everything.text)
    assert removed == ["return x * torch.sigmoid(x)", "return x / (1 + torch.exp(-x))", "return h.sigmoid() * h"]
    assert added == ["return nn.functional.silu(x)", "return nn.functional.silu(x)",
                     "return nn.functional.silu(h)"]
    assert "    return x * torch.sigmoid(x)\n\n\nclass Inner" in everything.text  # `unused` and `Other` untouched
    assert "h = swish(x)   # keep this comment" in everything.text and "+  z.sum()" in everything.text
    assert len(found) == 4  # all three together, then each alone


def test_a_file_that_does_not_parse_has_no_rewrites():
    assert rewrites("class Model(:\n", "Model") == []
