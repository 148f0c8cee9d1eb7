"""transformers' apply_rotary_pos_emb (transformers.models.llama.modeling_llama, rotate_half convention, shared by Mistral,
Qwen2, Gemma...): `query_states, key_states = apply_rotary_pos_emb(query_states, key_states, cos, sin)` in LlamaAttention,
with cos and sin of shape (batch, seq, head_dim) from LlamaRotaryEmbedding. Llama-3-8B: 32 query heads and 8 key-value
heads of 128, 8 sequences of 2048 tokens. Two outputs."""
import os

import torch
import torch.nn as nn
from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HEADS, KV_HEADS, HEAD_DIM = (2, 8, 4, 2, 16) if SMALL else (8, 2048, 32, 8, 128)


class Model(nn.Module):
    def forward(self, query_states, key_states, cos, sin):
        return apply_rotary_pos_emb(query_states, key_states, cos, sin)


def _cos_sin(batch, seq):
    inv_freq = 1.0 / (500000.0 ** (torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM))
    freqs = torch.arange(seq, dtype=torch.float32)[:, None] * inv_freq[None, :]
    emb = torch.cat((freqs, freqs), dim=-1).expand(batch, seq, HEAD_DIM)
    return emb.cos().to(DTYPE), emb.sin().to(DTYPE)


def get_inputs():
    cos, sin = _cos_sin(B, T)
    return [torch.randn(B, HEADS, T, HEAD_DIM, dtype=DTYPE), torch.randn(B, KV_HEADS, T, HEAD_DIM, dtype=DTYPE), cos, sin]


def get_init_inputs():
    return []
