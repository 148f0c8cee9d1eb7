"""The elementwise part of transformers' GemmaMLP (GeGLU with `ACT2FN["gelu_pytorch_tanh"]`):
`self.act_fn(self.gate_proj(x)) * self.up_proj(x)` on the two projections' outputs. Gemma-2B: intermediate 16384,
2 sequences of 2048 tokens."""
import os

import torch
import torch.nn as nn
from transformers.activations import ACT2FN

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, INTERMEDIATE = (2, 8, 96) if SMALL else (2, 2048, 16384)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act_fn = ACT2FN["gelu_pytorch_tanh"]

    def forward(self, gate, up):
        return self.act_fn(gate) * up


def get_inputs():
    return [torch.randn(B, T, INTERMEDIATE, dtype=DTYPE), torch.randn(B, T, INTERMEDIATE, dtype=DTYPE)]


def get_init_inputs():
    return []
