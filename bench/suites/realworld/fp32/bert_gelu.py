"""transformers GELUActivation (`ACT2FN["gelu"]`, the exact erf GELU), as BertIntermediate calls
`self.intermediate_act_fn(hidden_states)` after its dense layer. BERT-base: 3072 features, 32 sequences of 512."""
import os

import torch
import torch.nn as nn
from transformers.activations import ACT2FN

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, INNER = (2, 8, 96) if SMALL else (32, 512, 3072)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.intermediate_act_fn = ACT2FN["gelu"]

    def forward(self, hidden_states):
        return self.intermediate_act_fn(hidden_states)


def get_inputs():
    return [torch.randn(B, T, INNER, dtype=DTYPE)]


def get_init_inputs():
    return []
