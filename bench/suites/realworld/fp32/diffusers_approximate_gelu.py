"""diffusers ApproximateGELU (diffusers.models.activations.ApproximateGELU): proj then `x * torch.sigmoid(1.702 * x)`,
the first layer of diffusers' FeedForward with `activation_fn="geglu-approximate"`. dim 640, inner 2560
(SD's second down block), 1024 tokens (32x32 latents), batch 8."""
import os

import torch
import torch.nn as nn
from diffusers.models.activations import ApproximateGELU

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, TOKENS, DIM, INNER = (2, 8, 32, 64) if SMALL else (8, 1024, 640, 2560)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = ApproximateGELU(DIM, INNER)
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.act(hidden_states)


def get_inputs():
    return [torch.randn(B, TOKENS, DIM, dtype=DTYPE)]


def get_init_inputs():
    return []
