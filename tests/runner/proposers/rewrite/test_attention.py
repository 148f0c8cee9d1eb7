"""Attention written out to F.scaled_dot_product_attention (runner/proposers/rewrite/attention.py): timm's and
nanoGPT's blocks, checked by running them before and after; left alone where the probabilities are used again, the
softmax is over another dim, or the mask is not -inf."""

from __future__ import annotations

import textwrap

import pytest
import torch

from runner.proposers.rewrite.proposer import rewrites

from .test_rules import changed, load

TIMM = textwrap.dedent('''\
    import torch
    import torch.nn as nn


    class Attention(nn.Module):
        def __init__(self, dim=32, num_heads=4, attn_drop=0.1):
            super().__init__()
            self.num_heads = num_heads
            self.scale = (dim // num_heads) ** -0.5
            self.qkv = nn.Linear(dim, dim * 3)
            self.attn_drop = nn.Dropout(attn_drop)
            self.proj = nn.Linear(dim, dim)

        def forward(self, x):
            B, N, C = x.shape
            qkv = self.qkv(x).reshape(B, N, 3, self.num_heads, C // self.num_heads).permute(2, 0, 3, 1, 4)
            q, k, v = qkv.unbind(0)

            attn = (q @ k.transpose(-2, -1)) * self.scale
            attn = attn.softmax(dim=-1)
            attn = self.attn_drop(attn)

            x = (attn @ v).transpose(1, 2).reshape(B, N, C)
            return self.proj(x)
''')

NANO = textwrap.dedent('''\
    import math

    import torch
    import torch.nn as nn
    from torch.nn import functional as F


    class CausalSelfAttention(nn.Module):
        def __init__(self, n_embd=32, n_head=4, block_size=16):
            super().__init__()
            self.c_attn = nn.Linear(n_embd, 3 * n_embd)
            self.n_head, self.n_embd = n_head, n_embd
            self.register_buffer("bias", torch.tril(torch.ones(block_size, block_size)).view(1, 1, block_size, block_size))

        def forward(self, x):
            B, T, C = x.size()
            q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
            k = k.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            q = q.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            v = v.view(B, T, self.n_head, C // self.n_head).transpose(1, 2)
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            att = att.masked_fill(self.bias[:, :, :T, :T] == 0, float("-inf"))
            att = F.softmax(att, dim=-1)
            y = att @ v
            return y.transpose(1, 2).contiguous().view(B, T, C)
''')


def run(text: str, name: str, x: torch.Tensor) -> torch.Tensor:
    torch.manual_seed(0)
    model = load(text, name)().eval()
    with torch.no_grad():
        return model(x)


@pytest.mark.parametrize("text, name, removed, added", [
    (TIMM, "Attention", 4, "x = nn.functional.scaled_dot_product_attention("),
    (NANO, "CausalSelfAttention", 4, "y = F.scaled_dot_product_attention("),
])
def test_attention_written_out_is_sdpa(text, name, removed, added):
    (r,) = rewrites(text, name)
    old, new = changed(text, r.text)
    assert len(old) == removed and new[0] == added and r.sites[0].rule == "attention"
    assert "scale=" in r.text and max(len(line) for line in r.text.splitlines()) <= 120
    first = min(k for k, line in enumerate(text.splitlines(), 1) if line.strip() in old)
    last = max(k for k, line in enumerate(text.splitlines(), 1) if line.strip() in old)
    assert r.idea().startswith(f"Rewrite the module's PyTorch source (no kernel). lines {first}-{last}: ")
    x = torch.randn(2, 12, 32)
    torch.testing.assert_close(run(r.text, name, x), run(text, name, x), atol=1e-5, rtol=1e-5)
    if name == "Attention":
        assert "dropout_p=self.attn_drop.p if self.training else 0.0" in r.text and "training" in r.idea()
    else:
        assert "attn_mask=self.bias[:, :, :T, :T] != 0," in r.text


@pytest.mark.parametrize("old, new", [
    ("        y = att @ v\n        return", "        y = att @ v\n        self.last = att\n        return"),  # read again
    ("att = F.softmax(att, dim=-1)", "att = F.softmax(att, dim=1)"),  # another dim
    ('float("-inf")', "-1e4"),  # a finite fill is not a mask
])
def test_what_is_not_sdpa_stays(old, new):
    assert old in NANO
    assert rewrites(NANO.replace(old, new), "CausalSelfAttention") == []
