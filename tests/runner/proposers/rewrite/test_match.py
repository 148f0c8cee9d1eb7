"""Finding rewrite sites (runner/proposers/rewrite/match.py): temporaries are folded in only while their inputs
hold, only from the same block, and go only when nothing else reads them; an unknown dim is guarded where it can be
tested, and the rewrite dropped where it cannot."""

from __future__ import annotations

from runner.proposers.rewrite.proposer import rewrites

from .test_rules import X3, X, changed, equivalent, module


def test_a_temporary_whose_input_is_rebound_before_its_use_is_not_folded():
    body = "m = x.max(-1, keepdim=True)[0]\nx = x * 2\ne = torch.exp(x - m)\nreturn e / e.sum(-1, keepdim=True)"
    text = module(body)
    r = equivalent(text, X3)
    assert changed(text, r.text) == (["e = torch.exp(x - m)", "return e / e.sum(-1, keepdim=True)"],
                                     ["return torch.softmax(x - m, dim=-1)"])  # still a softmax, of x - m


def test_a_temporary_from_another_block_is_not_folded():
    text = module("e = torch.exp(x)\nif x.shape[0] > 0:\n    return e / e.sum(-1, keepdim=True)\nreturn e")
    assert rewrites(text, "Model") == []


def test_a_temporary_read_again_is_kept():
    text = module("e = torch.exp(x)\ny = e / e.sum(-1, keepdim=True)\nreturn y + e")
    r = equivalent(text, X3)
    assert changed(text, r.text) == (["y = e / e.sum(-1, keepdim=True)"], ["y = torch.softmax(x, dim=-1)"])


def test_an_unknown_dim_of_an_expression_that_cannot_be_tested_drops_the_rewrite():
    assert rewrites(module("return torch.diag(self.gain) @ self.fc(x)"), "Model") == []


def test_a_guard_keeps_the_temporaries_its_other_branch_reads():
    text = module("d = torch.diag(self.gain)\nreturn d @ x")
    r = equivalent(text, X)
    assert changed(text, r.text) == (["return d @ x"], [
        "return self.gain[:, None] * x if x.dim() >= 2 and x.shape[-2] == self.gain.shape[0] and "
        "(x.dtype == self.gain.dtype) else d @ x"])


def test_a_temporary_whose_input_is_written_in_place_before_its_use_is_not_folded():
    text = module("e = torch.exp(x)\nx.mul_(2)\nreturn e / e.sum(-1, keepdim=True)")
    assert rewrites(text, "Model") == []
    text = module("e = torch.exp(x)\nh = self.fc(x)\nreturn e / e.sum(-1, keepdim=True) + h")  # a module may
    assert rewrites(text, "Model") == []


def test_a_temporary_the_new_expression_names_is_kept():
    text = module("w = self.weight * 2\nu = x.mean(-1, keepdim=True)\nv = ((x - u) ** 2).mean(-1, keepdim=True)\n"
                  "return (x - u) / torch.sqrt(v + 1e-5) * w")
    r = equivalent(text, X3)
    assert changed(text, r.text) == (["u = x.mean(-1, keepdim=True)", "v = ((x - u) ** 2).mean(-1, keepdim=True)",
                                      "return (x - u) / torch.sqrt(v + 1e-5) * w"],
                                     ["return F.layer_norm(x, (x.shape[-1],), w, None, 1e-05)"])
