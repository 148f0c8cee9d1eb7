"""transformers' GPT-NeoX apply_rotary_pos_emb (transformers.models.gpt_neox.modeling_gpt_neox): partial rotary - the
first rotary_dim = rotary_pct * head_dim features are rotated (rotate_half), the rest pass through, then concatenated:
`query, key = apply_rotary_pos_emb(query, key, cos, sin)` in GPTNeoXAttention. Pythia-6.9B: 32 heads of 128,
rotary_pct 0.25 (32 rotated dims), 8 sequences of 2048 tokens. Two outputs."""
import os

import torch
import torch.nn as nn
from transformers.models.gpt_neox.modeling_gpt_neox import apply_rotary_pos_emb

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HEADS, HEAD_DIM = (2, 8, 4, 32) if SMALL else (8, 2048, 32, 128)
ROTARY_DIM = HEAD_DIM // 4


class Model(nn.Module):
    def forward(self, query, key, cos, sin):
        return apply_rotary_pos_emb(query, key, cos, sin)


def get_inputs():
    inv_freq = 1.0 / (10000.0 ** (torch.arange(0, ROTARY_DIM, 2, dtype=torch.float32) / ROTARY_DIM))
    freqs = torch.arange(T, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1).expand(B, T, ROTARY_DIM)
    return [torch.randn(B, HEADS, T, HEAD_DIM, dtype=DTYPE), torch.randn(B, HEADS, T, HEAD_DIM, dtype=DTYPE),
            emb.cos().to(DTYPE), emb.sin().to(DTYPE)]


def get_init_inputs():
    return []
