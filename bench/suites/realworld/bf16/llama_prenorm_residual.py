"""A pre-norm decoder layer's residual step with transformers' LlamaRMSNorm, as LlamaDecoderLayer writes it:
`hidden_states = residual + hidden_states; residual = hidden_states; hidden_states = self.post_attention_layernorm(
hidden_states)` - two outputs, the normalised tensor for the MLP and the sum for the next residual. Llama-3-8B:
hidden 4096, 8 sequences of 2048 tokens."""
import os

import torch
import torch.nn as nn
from transformers.models.llama.modeling_llama import LlamaRMSNorm

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (2, 8, 64) if SMALL else (8, 2048, 4096)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.post_attention_layernorm = LlamaRMSNorm(HIDDEN, eps=1e-5)
        with torch.no_grad():
            self.post_attention_layernorm.weight.normal_(1.0, 0.1)
        self.to(DTYPE)

    def forward(self, hidden_states, residual):
        hidden_states = residual + hidden_states
        residual = hidden_states
        hidden_states = self.post_attention_layernorm(hidden_states)
        return hidden_states, residual


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE), torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
