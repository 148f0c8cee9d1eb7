"""Attention scores to probabilities: softmax over the last dimension of scores scaled by a learned temperature."""

import torch
import torch.nn as nn


# fusebot: optimize
class ScaledSoftmax(nn.Module):
    def __init__(self, heads: int):
        super().__init__()
        self.heads = heads
        self.register_buffer("inv_temperature", torch.tensor(1.0 / 0.7))

    def forward(self, scores):
        # scores: [B, H, S, S]
        return torch.softmax(scores * self.inv_temperature, dim=-1)


batch, heads, seq = 4, 8, 128


def get_inputs():
    return [torch.randn(batch, heads, seq, seq)]


def get_second_inputs():
    return [torch.randn(batch + 1, heads, seq + 17, seq + 17)]


def get_init_inputs():
    return [heads]
