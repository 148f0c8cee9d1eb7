"""transformers T5LayerNorm (RMS norm, no mean, no bias): `self.layer_norm(hidden_states)` before each T5 block's attention
and feed-forward. The variance is taken in fp32; a half-precision weight casts the normalised values to its dtype.
T5-large / Flan-T5-large: d_model 1024, 16 sequences of 1024 tokens."""
import os

import torch
import torch.nn as nn
from transformers.models.t5.modeling_t5 import T5LayerNorm

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, D_MODEL = (2, 8, 48) if SMALL else (16, 1024, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layer_norm = T5LayerNorm(D_MODEL, eps=1e-6)
        with torch.no_grad():
            self.layer_norm.weight.normal_(1.0, 0.1)
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.layer_norm(hidden_states)


def get_inputs():
    return [torch.randn(B, T, D_MODEL, dtype=DTYPE)]


def get_init_inputs():
    return []
