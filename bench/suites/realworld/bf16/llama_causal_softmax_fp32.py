"""Llama's eager attention probabilities with the causal mask built in forward, as transformers' LlamaAttention
computed them (transformers 4.3x: `_make_causal_mask`, then `attn_weights = attn_weights + causal_mask`,
`nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(query_states.dtype)`): a finfo.min mask above
the diagonal from `torch.full` + `arange` + `masked_fill_`, scaled scores, the softmax in fp32 and cast back. The
input is q @ k^T. Llama-2-7B: 32 heads of 128, 4 sequences of 2048 tokens."""
import math
import os

import torch
import torch.nn as nn

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, HEADS, T, HEAD_DIM = (2, 2, 12, 16) if SMALL else (4, 32, 2048, 128)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.scaling = 1 / math.sqrt(HEAD_DIM)

    def forward(self, attn_weights):
        bsz, _, tgt_len, src_len = attn_weights.shape
        dtype = attn_weights.dtype
        mask = torch.full((tgt_len, tgt_len), torch.finfo(dtype).min, device=attn_weights.device)
        mask_cond = torch.arange(mask.size(-1), device=attn_weights.device)
        mask.masked_fill_(mask_cond < (mask_cond + 1).view(mask.size(-1), 1), 0)
        mask = mask.to(dtype)
        causal_mask = mask[None, None, :, :].expand(bsz, 1, tgt_len, src_len)
        attn_weights = attn_weights * self.scaling + causal_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1, dtype=torch.float32).to(dtype)
        return attn_weights


def get_inputs():
    return [torch.randn(B, HEADS, T, T, dtype=DTYPE) * 8]


def get_init_inputs():
    return []
