"""diffusers AdaLayerNormZero (diffusers.models.normalization), Flux's FluxTransformerBlock `norm1`:
`norm_hidden_states, gate_msa, shift_mlp, scale_mlp, gate_mlp = self.norm1(hidden_states, emb=temb)`: the
conditioning through SiLU and a Linear to six modulations, then LayerNorm (no affine, eps 1e-6) scaled by
(1 + scale) and shifted. Flux at 1024x1024: 4096 image tokens of 3072, a batch of 1."""
import os

import torch
import torch.nn as nn
from diffusers.models.normalization import AdaLayerNormZero

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, TOKENS, DIM = (1, 16, 32) if SMALL else (1, 4096, 3072)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm1 = AdaLayerNormZero(DIM)
        self.to(DTYPE)

    def forward(self, hidden_states, temb):
        return self.norm1(hidden_states, emb=temb)


def get_inputs():
    return [torch.randn(B, TOKENS, DIM, dtype=DTYPE), torch.randn(B, DIM, dtype=DTYPE)]


def get_init_inputs():
    return []
