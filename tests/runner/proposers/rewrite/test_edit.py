"""Text edits (runner/proposers/rewrite/edit.py): parentheses only where needed, the file's own quotes, long calls
one argument a line, and edits that overlap, delete a shared line or do not parse back to their tree refused."""

from __future__ import annotations

import ast

from runner.proposers.rewrite.edit import Edit, apply
from runner.proposers.rewrite.proposer import rewrites

from .test_rules import changed


def test_parentheses_only_where_the_context_needs_them():
    text = "import torch\n\n\nclass M(torch.nn.Module):\n    def forward(self, x, g):\n" \
           "        # x: [N, M]; g: [N]\n        return torch.diag(g).matmul(x).sum() + 2 * (torch.diag(g) @ x)\n"
    (r,) = [r for r in rewrites(text, "M") if len(r.sites) == 2]
    guard = "x.dim() >= 2 and x.shape[-2] == g.shape[0] and (x.dtype == g.dtype)"
    assert changed(text, r.text)[1] == [f"return (g[:, None] * x if {guard} else torch.diag(g).matmul(x)).sum() + "
                                        f"2 * (g[:, None] * x if {guard} else torch.diag(g) @ x)"]


def test_an_edit_that_does_not_parse_back_to_its_tree_or_overlaps_is_refused():
    text = "y = a + b\nz = 1; w = 2\n"
    tree = ast.parse(text)
    add = tree.body[0].value
    assert apply(text, [Edit.of(add, ast.parse("a - b", mode="eval").body)]) == "y = a - b\nz = 1; w = 2\n"
    assert apply(text, [Edit.of(add, ast.Name("c")), Edit.of(add.left, ast.Name("d"))]) is None  # overlapping
    assert apply(text, [Edit.of(tree.body[1])]) is None  # a statement sharing its line is not deleted
    assert apply(text, [Edit.of(tree.body[0])]) == "z = 1; w = 2\n"


def test_the_files_own_quotes_and_a_long_call_one_argument_a_line():
    text = 'import torch\nimport torch.nn.functional as F\n\n\nclass M(torch.nn.Module):\n    def forward(self, x):\n' \
           '        """Doc."""\n        return 0.5 * x * (1 + torch.tanh(0.7978845608028654 * (x + 0.044715 * x ** 3)))\n'
    (r,) = rewrites(text, "M")
    assert changed(text, r.text)[1] == ['return F.gelu(x, approximate="tanh")']
    long = "y = " + "f(" + ", ".join(f"argument_{k}" for k in range(12)) + ")\n"
    call = ast.parse(long).body[0].value
    out = apply(long, [Edit.of(call, ast.parse("g(" + ", ".join(f"argument_{k}" for k in range(14)) + ")",
                                                 mode="eval").body)])
    assert out.splitlines()[:2] == ["y = g(", "    argument_0,"] and out.endswith("    argument_13,\n)\n")
