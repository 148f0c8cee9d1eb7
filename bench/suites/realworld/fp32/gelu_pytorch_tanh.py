"""transformers `ACT2FN["gelu_pytorch_tanh"]` (F.gelu(x, approximate="tanh")), the hidden_act of Gemma, Phi and
GPT-BigCode, applied to the MLP's up projection. StarCoder-style: 4 sequences of 2048 tokens, 8192 features."""
import os

import torch
import torch.nn as nn
from transformers.activations import ACT2FN

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, INNER = (2, 8, 96) if SMALL else (4, 2048, 8192)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = ACT2FN["gelu_pytorch_tanh"]

    def forward(self, hidden_states):
        return self.act(hidden_states)


def get_inputs():
    return [torch.randn(B, T, INNER, dtype=DTYPE)]


def get_init_inputs():
    return []
