"""GPT-2's eager attention probabilities as transformers' GPT2Attention._attn computed them (transformers 4.x; nanoGPT's
CausalSelfAttention is the same): scale by 1/sqrt(head_dim), slice the registered lower-triangular `bias` buffer
(`self.bias[:, :, key_length - query_length : key_length, :key_length]`), `torch.where(causal_mask, attn_weights,
finfo.min)`, softmax, cast to the values' dtype, attention dropout (identity in eval). The input is q @ k^T.
GPT-2 small: 12 heads of 64, 8 sequences of 1024 tokens."""
import os

import torch
import torch.nn as nn

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, HEADS, T, HEAD_DIM, MAX_POS = (2, 2, 12, 16, 16) if SMALL else (8, 12, 1024, 64, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.register_buffer(
            "bias",
            torch.tril(torch.ones((MAX_POS, MAX_POS), dtype=torch.bool)).view(1, 1, MAX_POS, MAX_POS),
            persistent=False,
        )
        self.head_dim = HEAD_DIM
        self.attn_dropout = nn.Dropout(0.1)

    def forward(self, attn_weights):
        attn_weights = attn_weights / torch.full(
            [], self.head_dim**0.5, dtype=attn_weights.dtype, device=attn_weights.device
        )
        query_length, key_length = attn_weights.size(-2), attn_weights.size(-1)
        causal_mask = self.bias[:, :, key_length - query_length : key_length, :key_length]
        mask_value = torch.finfo(attn_weights.dtype).min
        mask_value = torch.full([], mask_value, dtype=attn_weights.dtype, device=attn_weights.device)
        attn_weights = torch.where(causal_mask, attn_weights.to(attn_weights.dtype), mask_value)
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)
        attn_weights = attn_weights.type(DTYPE)
        attn_weights = self.attn_dropout(attn_weights)
        return attn_weights


def get_inputs():
    return [torch.randn(B, HEADS, T, T, dtype=DTYPE) * 8]


def get_init_inputs():
    return []
