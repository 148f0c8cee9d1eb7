"""transformers ForMaskedLMLoss (transformers.loss.loss_utils), what BertForMaskedLM's `self.loss_function(logits,
labels, vocab_size)` runs when pre-training with DataCollatorForLanguageModeling: logits upcast to fp32 and
flattened, `F.cross_entropy(..., ignore_index=-100, reduction="mean")`, where only the 15% of tokens the collator
masked carry a label (the other 85% are -100). BERT's vocabulary of 30522, 16 sequences of 512 tokens."""
import os

import torch
import torch.nn as nn
from transformers.loss.loss_utils import ForMaskedLMLoss

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, VOCAB = (2, 8, 320) if SMALL else (16, 512, 30522)


class Model(nn.Module):
    def forward(self, logits, labels):
        return ForMaskedLMLoss(logits, labels, vocab_size=VOCAB)


def get_inputs():
    labels = torch.randint(0, VOCAB, (B, T))
    masked = torch.rand(B, T) < 0.15
    masked[:, 0] = True  # at least one label per sequence at CI's sizes
    return [torch.randn(B, T, VOCAB, dtype=DTYPE) * 2, labels.masked_fill(~masked, -100)]


def get_init_inputs():
    return []
