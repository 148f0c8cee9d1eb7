"""An MLP block's epilogue: y = relu(x * scale + bias), three elementwise passes in eager PyTorch."""

import torch
import torch.nn as nn


# fusebot: optimize
class ScaledBiasReLU(nn.Module):
    def __init__(self, features: int):
        super().__init__()
        self.scale = nn.Parameter(torch.full((), 0.5))
        self.bias = nn.Parameter(torch.randn(features) * 0.1)

    def forward(self, x):
        # x: [B, F]; scale: []; bias: [F]
        return torch.relu(x * self.scale + self.bias)


batch, features = 256, 4096


def get_inputs():
    return [torch.randn(batch, features)]


def get_second_inputs():
    return [torch.randn(batch * 2 + 3, features)]


def get_init_inputs():
    return [features]
