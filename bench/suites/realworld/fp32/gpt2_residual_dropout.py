"""The residual step after GPT-2's attention, as transformers' GPT2Attention and GPT2Block write it:
`attn_output = self.resid_dropout(attn_output)` (nn.Dropout(config.resid_pdrop), identity in eval) then
`hidden_states = attn_output + residual`. GPT-2 medium: 1024 features, 8 sequences of 1024 tokens."""
import os

import torch
import torch.nn as nn
from transformers import GPT2Config

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (2, 8, 32) if SMALL else (8, 1024, 1024)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.resid_dropout = nn.Dropout(GPT2Config().resid_pdrop)

    def forward(self, attn_output, residual):
        attn_output = self.resid_dropout(attn_output)
        hidden_states = attn_output + residual
        return hidden_states


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE), torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
