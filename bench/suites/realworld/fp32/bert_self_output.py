"""transformers BertSelfOutput: `self.output(self_outputs, hidden_states)` in BertAttention - dense (768 -> 768), dropout
(identity in eval), then LayerNorm(hidden_states + input_tensor), a post-residual LayerNorm over 768-wide rows.
BERT-base: 32 sequences of 512 tokens."""
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
        config = BertConfig(hidden_size=HIDDEN, num_attention_heads=12 if not SMALL else 4,
                            intermediate_size=4 * HIDDEN)
        self.output = BertSelfOutput(config)
        with torch.no_grad():
            self.output.LayerNorm.weight.normal_(1.0, 0.1)
            self.output.LayerNorm.bias.normal_(0.0, 0.1)
        self.to(DTYPE)

    def forward(self, self_outputs, hidden_states):
        return self.output(self_outputs, hidden_states)


def get_inputs():
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE), torch.randn(B, T, HIDDEN, dtype=DTYPE)]


def get_init_inputs():
    return []
