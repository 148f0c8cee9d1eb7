"""transformers ForCausalLMLoss (transformers.loss.loss_utils), what LlamaForCausalLM's `self.loss_function(logits,
labels, vocab_size)` runs: logits upcast to fp32, labels shifted by padding with -100, flattened, then
`F.cross_entropy(..., ignore_index=-100, reduction="mean")`. Llama-2's vocabulary of 32000, 8 sequences of 1024
tokens, about 10% of the labels ignored (-100: padding and prompt tokens)."""
import os

import torch
import torch.nn as nn
from transformers.loss.loss_utils import ForCausalLMLoss

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, VOCAB = (2, 8, 320) if SMALL else (8, 1024, 32000)


class Model(nn.Module):
    def forward(self, logits, labels):
        return ForCausalLMLoss(logits, labels, vocab_size=VOCAB)


def get_inputs():
    labels = torch.randint(0, VOCAB, (B, T))
    labels = labels.masked_fill(torch.rand(B, T) < 0.1, -100)
    return [torch.randn(B, T, VOCAB, dtype=DTYPE) * 2, labels]


def get_init_inputs():
    return []
