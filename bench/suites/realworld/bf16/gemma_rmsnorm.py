"""transformers GemmaRMSNorm: the (1 + weight) RMS norm of Gemma, computed in fp32 and cast back once at the end
(`output * (1.0 + self.weight.float())` then `.type_as(x)`); `self.input_layernorm(hidden_states)` in each Gemma
decoder layer. Gemma-2B: hidden 2048, 8 sequences of 2048 tokens."""
import os

import torch
import torch.nn as nn
from transformers.models.gemma.modeling_gemma import GemmaRMSNorm

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (2, 8, 64) if SMALL else (8, 2048, 2048)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = GemmaRMSNorm(HIDDEN, eps=1e-6)
        with torch.no_grad():
            self.input_layernorm.weight.normal_(0.0, 0.1)  # Gemma stores weight - 1 (zeros at init)
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.input_layernorm(hidden_states)


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
