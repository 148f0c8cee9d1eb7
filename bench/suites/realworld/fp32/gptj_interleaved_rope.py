"""transformers' GPT-J rotary embedding (transformers.models.gptj.modeling_gptj): interleaved pairs (rotate_every_two),
sin/cos gathered from the sinusoidal table by position ids, applied to the first rotary_dim features, as GPTJAttention
does: `sincos = embed_positions[position_ids]; sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1);
k_rot = apply_rotary_pos_emb(key[:, :, :, :rotary_dim], sin, cos)`, then concatenated with the rest. GPT-J-6B:
16 heads of 256, rotary_dim 64, 8 sequences of 2048 tokens; query and key (two outputs)."""
import os

import torch
import torch.nn as nn
from transformers.models.gptj.modeling_gptj import apply_rotary_pos_emb, create_sinusoidal_positions

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HEADS, HEAD_DIM, ROTARY_DIM, MAX_POS = (2, 8, 4, 32, 16, 64) if SMALL else (8, 2048, 16, 256, 64, 2048)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.rotary_dim = ROTARY_DIM
        self.register_buffer("embed_positions", create_sinusoidal_positions(MAX_POS, ROTARY_DIM))
        self.to(DTYPE)

    def forward(self, query, key, position_ids):
        # query, key: (batch, seq, heads, head_dim), as GPTJAttention holds them before its permute
        sincos = self.embed_positions[position_ids]
        sin, cos = torch.split(sincos, sincos.shape[-1] // 2, dim=-1)
        k_rot = key[:, :, :, : self.rotary_dim]
        k_pass = key[:, :, :, self.rotary_dim :]
        q_rot = query[:, :, :, : self.rotary_dim]
        q_pass = query[:, :, :, self.rotary_dim :]
        k_rot = apply_rotary_pos_emb(k_rot, sin, cos)
        q_rot = apply_rotary_pos_emb(q_rot, sin, cos)
        key = torch.cat([k_rot, k_pass], dim=-1)
        query = torch.cat([q_rot, q_pass], dim=-1)
        return query, key


def get_inputs():
    position_ids = torch.arange(T).expand(B, T).contiguous()
    return [torch.randn(B, T, HEADS, HEAD_DIM, dtype=DTYPE), torch.randn(B, T, HEADS, HEAD_DIM, dtype=DTYPE),
            position_ids]


def get_init_inputs():
    return []
