"""The memory-bound part of transformers' BertSelfOutput / BertOutput: `self.LayerNorm(self.dropout(hidden_states) +
input_tensor)` with the module's own nn.LayerNorm (eps 1e-12) and dropout (identity in eval), after the dense layer.
BERT-base: 768-wide rows, 32 sequences of 512 tokens (a second shape: 16 of 384)."""
import os

import torch
import torch.nn as nn
from transformers import BertConfig
from transformers.models.bert.modeling_bert import BertSelfOutput

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (2, 8, 48) if SMALL else (32, 512, 768)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.output = BertSelfOutput(BertConfig(hidden_size=HIDDEN, num_attention_heads=4 if SMALL else 12))
        with torch.no_grad():
            self.output.LayerNorm.weight.normal_(1.0, 0.1)
            self.output.LayerNorm.bias.normal_(0.0, 0.1)
        del self.output.dense  # the GEMM is not this problem's
        self.to(DTYPE)

    def forward(self, hidden_states, input_tensor):
        return self.output.LayerNorm(self.output.dropout(hidden_states) + input_tensor)


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE), torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_second_inputs():
    return [torch.randn(B // 2, T * 3 // 4, HIDDEN, dtype=DTYPE), torch.randn(B // 2, T * 3 // 4, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
