"""diffusers RMSNorm (diffusers.models.normalization.RMSNorm) as Flux's and SD3's attention use it on queries and keys:
`attn.norm_q(query)` over the head dim of a (batch, heads, tokens, head_dim) tensor, eps 1e-6, elementwise affine.
Flux at 1024x1024: 24 heads of 128, 4096 image + 512 text tokens; a batch of 2."""
import os

import torch
import torch.nn as nn
from diffusers.models.normalization import RMSNorm

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, HEADS, TOKENS, HEAD_DIM = (1, 2, 12, 32) if SMALL else (2, 24, 4608, 128)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm_q = RMSNorm(HEAD_DIM, eps=1e-6, elementwise_affine=True)
        with torch.no_grad():
            self.norm_q.weight.normal_(1.0, 0.1)
        self.to(DTYPE)

    def forward(self, query):
        return self.norm_q(query)


def get_inputs():
    return [torch.randn(B, HEADS, TOKENS, HEAD_DIM, dtype=DTYPE)]


def get_init_inputs():
    return []
