"""transformers GPT2MLP: `self.mlp(hidden_states)` in GPT2Block - c_fc (Conv1D 768 -> 3072), NewGELU, c_proj (Conv1D
3072 -> 768), dropout (identity in eval). GPT-2 small: 8 sequences of 1024 tokens."""
import os

import torch
import torch.nn as nn
from transformers import GPT2Config
from transformers.models.gpt2.modeling_gpt2 import GPT2MLP

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (2, 8, 32) if SMALL else (8, 1024, 768)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        config = GPT2Config(n_embd=HIDDEN, n_head=4 if SMALL else 12)
        self.mlp = GPT2MLP(4 * HIDDEN, config)
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
