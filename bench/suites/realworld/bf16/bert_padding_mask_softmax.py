"""BERT's eager attention probabilities with a padding mask, as transformers' BertSelfAttention and
`get_extended_attention_mask` computed them (transformers 4.x): the (batch, seq) 0/1 mask becomes
`(1.0 - mask[:, None, None, :]) * torch.finfo(dtype).min`, scores are scaled by 1/sqrt(head_dim), the mask added,
softmax, attention dropout (identity in eval). The input is q @ k^T and the tokenizer's attention_mask (sequences
padded to the longest, lengths 256-512). BERT-base: 12 heads of 64, 32 sequences of 512 tokens."""
import math
import os

import torch
import torch.nn as nn

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, HEADS, T, HEAD_DIM = (2, 2, 12, 16) if SMALL else (32, 12, 512, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.attention_head_size = HEAD_DIM
        self.dropout = nn.Dropout(0.1)

    def forward(self, attention_scores, attention_mask):
        extended_attention_mask = attention_mask[:, None, None, :].to(dtype=attention_scores.dtype)
        extended_attention_mask = (1.0 - extended_attention_mask) * torch.finfo(attention_scores.dtype).min
        attention_scores = attention_scores / math.sqrt(self.attention_head_size)
        attention_scores = attention_scores + extended_attention_mask
        attention_probs = nn.functional.softmax(attention_scores, dim=-1)
        attention_probs = self.dropout(attention_probs)
        return attention_probs


def get_inputs():
    lengths = torch.randint(T // 2, T + 1, (B,))
    lengths[0] = T  # the longest sequence sets the padded length
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return [torch.randn(B, HEADS, T, T, dtype=DTYPE) * 8, attention_mask]


def get_init_inputs():
    return []
