"""transformers NewGELUActivation (`ACT2FN["gelu_new"]`, GPT-2's activation: 0.5 * x * (1 + tanh(sqrt(2/pi) *
(x + 0.044715 x^3)))), as GPT2MLP calls `self.act(hidden_states)` on c_fc's output. GPT-2 small: 3072 features,
8 sequences of 1024 tokens (a second shape: 4 of 512)."""
import os

import torch
import torch.nn as nn
from transformers.activations import NewGELUActivation

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, INNER = (2, 8, 96) if SMALL else (8, 1024, 3072)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = NewGELUActivation()

    def forward(self, hidden_states):
        return self.act(hidden_states)


def get_inputs():
    return [torch.randn(B, T, INNER, dtype=DTYPE)]


def get_second_inputs():
    return [torch.randn(B // 2, T // 2, INNER, dtype=DTYPE)]


def get_init_inputs():
    return []
