"""diffusers apply_rotary_emb (diffusers.models.embeddings) as FluxAttnProcessor calls it on queries and keys:
`apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)` with the real form (`use_real=True`,
`use_real_unbind_dim=-1`: adjacent pairs rotated), queries and keys of shape (batch, tokens, heads, head_dim) and
FluxPosEmbed's fp32 cos and sin of shape (tokens, head_dim). Flux at 1024x1024: 4096 image + 512 text tokens, 24 heads
of 128, a batch of 1."""
import os

import torch
import torch.nn as nn
from diffusers.models.embeddings import apply_rotary_emb

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, TOKENS, HEADS, HEAD_DIM = (1, 12, 2, 32) if SMALL else (1, 4608, 24, 128)


class Model(nn.Module):
    def forward(self, query, key, cos, sin):
        image_rotary_emb = (cos, sin)
        query = apply_rotary_emb(query, image_rotary_emb, sequence_dim=1)
        key = apply_rotary_emb(key, image_rotary_emb, sequence_dim=1)
        return query, key


def get_inputs():
    # FluxPosEmbed: per axis, angles pos * theta^(-2i/dim), each repeated for the pair it rotates (repeat_interleave)
    pos = torch.arange(TOKENS, dtype=torch.float32)[:, None]
    inv = 10000.0 ** (-torch.arange(0, HEAD_DIM, 2, dtype=torch.float32) / HEAD_DIM)
    angles = (pos * inv).repeat_interleave(2, dim=1)
    return [torch.randn(B, TOKENS, HEADS, HEAD_DIM, dtype=DTYPE), torch.randn(B, TOKENS, HEADS, HEAD_DIM, dtype=DTYPE),
            angles.cos(), angles.sin()]


def get_init_inputs():
    return []
