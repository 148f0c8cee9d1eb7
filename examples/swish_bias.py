"""A learnable-slope Swish with a bias, as in some MLP variants: y = x * sigmoid(beta * x) + bias."""

import torch
import torch.nn as nn


# fusebot: optimize
class SwishBias(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.beta = nn.Parameter(torch.ones(()))
        self.bias = nn.Parameter(torch.zeros(features))

    def forward(self, x):
        # x: [B, T, F]; beta: []; bias: [F]
        return x * torch.sigmoid(x * self.beta) + self.bias


batch, tokens, features = 16, 128, 512


def get_inputs():
    return [torch.randn(batch, tokens, features)]


def get_second_inputs():
    return [torch.randn(batch + 1, tokens + 7, features)]


def get_init_inputs():
    return [features]
