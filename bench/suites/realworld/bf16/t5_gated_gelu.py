"""The elementwise part of transformers' T5DenseGatedActDense (T5 v1.1, Flan-T5: GeGLU with `ACT2FN["gelu_new"]`):
`hidden_gelu = self.act(self.wi_0(hidden_states)); hidden_linear = self.wi_1(hidden_states); hidden_states =
hidden_gelu * hidden_linear`, then dropout (identity in eval). Flan-T5-XL: d_ff 5120, 8 sequences of 1024 tokens."""
import os

import torch
import torch.nn as nn
from transformers.activations import ACT2FN

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, D_FF = (2, 8, 96) if SMALL else (8, 1024, 5120)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = ACT2FN["gelu_new"]
        self.dropout = nn.Dropout(0.1)

    def forward(self, wi_0_out, wi_1_out):
        hidden_gelu = self.act(wi_0_out)
        hidden_states = hidden_gelu * wi_1_out
        return self.dropout(hidden_states)


def get_inputs():
    return [torch.randn(B, T, D_FF, dtype=DTYPE), torch.randn(B, T, D_FF, dtype=DTYPE)]


def get_init_inputs():
    return []
