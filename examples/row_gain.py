"""Per-row gains written as a diagonal matrix product, y = diag(gain) @ x, as some gating and normalisation code
does: eager PyTorch builds the [N, N] diagonal matrix and runs a dense matmul, N times the multiplies it stands for.
A fused kernel multiplies each row by its gain in one pass (KernelBench level 1, problem 12, as a module)."""

import torch
import torch.nn as nn


# fusebot: optimize
class RowGain(nn.Module):
    def __init__(self, rows: int):
        super().__init__()
        self.gain = nn.Parameter(torch.rand(rows) + 0.5)

    def forward(self, x):
        # x: [N, M]; gain: [N]
        return torch.diag(self.gain) @ x


rows, cols = 1024, 512


def get_inputs():
    return [torch.randn(rows, cols)]


def get_second_inputs():
    return [torch.randn(rows, cols // 2 + 3)]


def get_init_inputs():
    return [rows]
