"""diffusers FP32LayerNorm (diffusers.models.normalization): the LayerNorm Wan's transformer blocks use (`norm2`,
elementwise affine, before the cross-attention): input and weights upcast to fp32, F.layer_norm, cast back to the
input's dtype. Wan 2.1 1.3B (dim 1536) on a 480p clip of 81 frames: 21 x 30 x 52 = 32760 tokens, a batch of 1."""
import os

import torch
import torch.nn as nn
from diffusers.models.normalization import FP32LayerNorm

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, TOKENS, DIM = (1, 24, 64) if SMALL else (1, 32760, 1536)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm2 = FP32LayerNorm(DIM, eps=1e-6, elementwise_affine=True)
        with torch.no_grad():
            self.norm2.weight.normal_(1.0, 0.1)
            self.norm2.bias.normal_(0.0, 0.1)
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.norm2(hidden_states)


def get_inputs():
    return [torch.randn(B, TOKENS, DIM, dtype=DTYPE)]


def get_init_inputs():
    return []
