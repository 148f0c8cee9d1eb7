"""transformers' LlamaRotaryEmbedding and apply_rotary_pos_emb together, as LlamaModel and LlamaAttention use them:
`cos, sin = self.rotary_emb(hidden_states, position_ids)` (cos/sin from the inverse frequencies and the position ids,
in fp32, cast to the activations' dtype), then `apply_rotary_pos_emb(query_states, key_states, cos, sin)`.
Llama-3-8B: 32 query heads, 8 key-value heads of 128, rope theta 500000, 8 sequences of 2048 tokens. Two outputs."""
import os

import torch
import torch.nn as nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding, apply_rotary_pos_emb

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HEADS, KV_HEADS, HEAD_DIM = (2, 8, 4, 2, 16) if SMALL else (8, 2048, 32, 8, 128)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = LlamaConfig(hidden_size=HEADS * HEAD_DIM, num_attention_heads=HEADS, num_key_value_heads=KV_HEADS,
                             max_position_embeddings=8192, rope_theta=500000.0)
        self.rotary_emb = LlamaRotaryEmbedding(config)
        self.to(DTYPE)

    def forward(self, query_states, key_states, position_ids):
        cos, sin = self.rotary_emb(query_states, position_ids)
        return apply_rotary_pos_emb(query_states, key_states, cos, sin)


def get_inputs():
    position_ids = torch.arange(T).expand(B, T).contiguous()
    return [torch.randn(B, HEADS, T, HEAD_DIM, dtype=DTYPE), torch.randn(B, KV_HEADS, T, HEAD_DIM, dtype=DTYPE),
            position_ids]


def get_init_inputs():
    return []
