"""What the source rewrites read and write (runner/proposers/rewrite_source.py): the functions a forward reaches in
its file, the dims the source shows, and edits that keep every other byte of the file."""

from __future__ import annotations

import ast
import textwrap

from runner.proposers.rewrite import rewrites
from runner.proposers.rewrite_source import Edit, Module, apply

from .test_rewrite_rules import changed

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


def test_parentheses_only_where_the_context_needs_them():
    text = "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x, g):\n" \
           "        # x: [N, M]; g: [N]\n        return torch.diag(g).matmul(x).sum() + 2 * (torch.diag(g) @ x)\n"
    (r,) = [r for r in rewrites(text, "M") if len(r.sites) == 2]
    assert changed(text, r.text)[1] == ["return (g[:, None] * x).sum() + 2 * (g[:, None] * x)"]


def test_an_edit_that_does_not_parse_back_to_its_tree_or_overlaps_is_refused():
    text = "y = a + b\nz = 1; w = 2\n"
    tree = ast.parse(text)
    add = tree.body[0].value
    assert apply(text, [Edit.of(add, ast.parse("a - b", mode="eval").body)]) == "y = a - b\nz = 1; w = 2\n"
    assert apply(text, [Edit.of(add, ast.Name("c")), Edit.of(add.left, ast.Name("d"))]) is None  # overlapping
    assert apply(text, [Edit.of(tree.body[1])]) is None  # a statement sharing its line is not deleted
    assert apply(text, [Edit.of(tree.body[0])]) == "z = 1; w = 2\n"


def test_a_file_that_does_not_parse_has_no_rewrites():
    assert rewrites("class Model(:\n", "Model") == []
