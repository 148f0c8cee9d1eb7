"""GPT-2's language-modelling loss as GPT2LMHeadModel computed it (transformers 4.x) and as most fine-tuning scripts
still write it: `shift_logits = lm_logits[..., :-1, :].contiguous(); shift_labels = labels[..., 1:].contiguous();
CrossEntropyLoss()(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))` (ignore_index -100).
GPT-2's vocabulary of 50257, 8 sequences of 1024 tokens, about 10% of the labels -100."""
import os

import torch
import torch.nn as nn
from torch.nn import CrossEntropyLoss

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, VOCAB = (2, 8, 503) if SMALL else (8, 1024, 50257)


class Model(nn.Module):
    def forward(self, lm_logits, labels):
        shift_logits = lm_logits[..., :-1, :].contiguous()
        shift_labels = labels[..., 1:].contiguous()
        loss_fct = CrossEntropyLoss()
        return loss_fct(shift_logits.view(-1, shift_logits.size(-1)), shift_labels.view(-1))


def get_inputs():
    labels = torch.randint(0, VOCAB, (B, T))
    labels = labels.masked_fill(torch.rand(B, T) < 0.1, -100)
    return [torch.randn(B, T, VOCAB, dtype=DTYPE) * 2, labels]


def get_init_inputs():
    return []
