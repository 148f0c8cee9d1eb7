"""transformers LlamaMLP: `self.mlp(hidden_states)` in LlamaDecoderLayer - down_proj(act_fn(gate_proj(x)) * up_proj(x)),
three GEMMs without bias and SwiGLU between. A Llama-architecture 1B model (TinyLlama): hidden 2048, intermediate 5632,
4 sequences of 2048 tokens."""
import os

import torch
import torch.nn as nn
from transformers import LlamaConfig
from transformers.models.llama.modeling_llama import LlamaMLP

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN, INTERMEDIATE = (2, 8, 32, 88) if SMALL else (4, 2048, 2048, 5632)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = LlamaConfig(hidden_size=HIDDEN, intermediate_size=INTERMEDIATE, hidden_act="silu",
                             num_attention_heads=4 if SMALL else 32)
        self.mlp = LlamaMLP(config)
        with torch.no_grad():
            for p in self.mlp.parameters():
                p.normal_(0.0, 0.02)
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.mlp(hidden_states)


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
