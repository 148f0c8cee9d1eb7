"""Masked mean pooling as sentence-transformers' model cards tell users to write it (`mean_pooling(model_output,
attention_mask)` on a transformers AutoModel's last hidden state; sentence_transformers.models.Pooling in mean mode
computes the same): `sum(token_embeddings * mask) / clamp(sum(mask), min=1e-9)` over the tokens. all-mpnet-base-v2:
768 features, 32 sequences padded to 512 tokens (lengths 64-512)."""
import os

import torch
import torch.nn as nn

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, T, HIDDEN = (3, 10, 48) if SMALL else (32, 512, 768)


def mean_pooling(model_output, attention_mask):
    token_embeddings = model_output[0]  # first element of model_output contains all token embeddings
    input_mask_expanded = attention_mask.unsqueeze(-1).expand(token_embeddings.size()).float()
    return torch.sum(token_embeddings * input_mask_expanded, 1) / torch.clamp(input_mask_expanded.sum(1), min=1e-9)


class Model(nn.Module):
    def forward(self, last_hidden_state, attention_mask):
        return mean_pooling((last_hidden_state,), attention_mask)


def get_inputs():
    lengths = torch.randint(T // 8, T + 1, (B,))
    lengths[0] = T
    attention_mask = (torch.arange(T)[None, :] < lengths[:, None]).long()
    return [torch.randn(B, T, HIDDEN, dtype=DTYPE), attention_mask]


def get_init_inputs():
    return []
