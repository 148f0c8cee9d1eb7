"""transformers LlamaRMSNorm (also Mistral's, Qwen2's): `self.input_layernorm(hidden_states)` in every decoder layer of a
Llama-style model; upcasts to fp32 for the statistics and casts back before the weight. Llama-2/3-8B: hidden 4096,
a batch of 8 sequences of 2048 tokens (a second shape: 4 of 4096)."""
import os

import torch
import torch.nn as nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (2, 8, 64) if SMALL else (8, 2048, 4096)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.input_layernorm = LlamaRMSNorm(HIDDEN, eps=1e-5)
        with torch.no_grad():
            self.input_layernorm.weight.normal_(1.0, 0.1)  # trained weights, not ones
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.input_layernorm(hidden_states)


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_second_inputs():
    return [torch.randn(B // 2, T * 2 - 1, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
