"""diffusers GELU (diffusers.models.activations.GELU) with approximate="tanh": proj then F.gelu, the first layer of the
FeedForward of PixArt-alpha's and DiT's transformer blocks (`activation_fn="gelu-approximate"`). PixArt-alpha at
512x512: dim 1152, inner 4608, 1024 tokens, batch 8."""
import os

import torch
import torch.nn as nn
from diffusers.models.activations import GELU

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, TOKENS, DIM, INNER = (2, 8, 32, 64) if SMALL else (8, 1024, 1152, 4608)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = GELU(DIM, INNER, approximate="tanh")
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.act(hidden_states)


def get_inputs():
    return [torch.randn(B, TOKENS, DIM, dtype=DTYPE)]


def get_init_inputs():
    return []
