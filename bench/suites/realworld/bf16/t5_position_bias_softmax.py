"""T5's eager attention probabilities as transformers' T5Attention computed them (transformers 4.x): the relative
position bias plus the extended padding mask added to the scores (no scaling in T5), `softmax(scores.float(),
dim=-1).type_as(scores)`, dropout (identity in eval). Inputs: q @ k^T, the position bias of shape (1, heads, q, k)
from `compute_bias`, and the tokenizer's attention_mask. T5-base: 12 heads, 16 sequences of 512 tokens."""
import os

import torch
import torch.nn as nn

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, HEADS, T = (2, 2, 12) if SMALL else (16, 12, 512)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.dropout = 0.1

    def forward(self, scores, position_bias, attention_mask):
        extended_mask = (1.0 - attention_mask[:, None, None, :].to(scores.dtype)) * torch.finfo(scores.dtype).min
        position_bias_masked = position_bias + extended_mask
        scores = scores + position_bias_masked  # (T5 adds in place, into its own matmul's output)
        attn_weights = nn.functional.softmax(scores.float(), dim=-1).type_as(scores)
        attn_weights = nn.functional.dropout(attn_weights, p=self.dropout, training=self.training)
        return attn_weights


def get_inputs():
    lengths = torch.randint(T // 2, T + 1, (B,))
    lengths[0] = T
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return [torch.randn(B, HEADS, T, T, dtype=DTYPE) * 4, torch.randn(1, HEADS, T, T, dtype=DTYPE) * 2, attention_mask]


def get_init_inputs():
    return []
