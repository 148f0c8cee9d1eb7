"""diffusers GEGLU (diffusers.models.activations.GEGLU), the first layer of a BasicTransformerBlock's FeedForward in
Stable Diffusion's UNet (`activation_fn="geglu"`): proj (dim -> 2 * inner), chunk in two, `hidden_states *
self.gelu(gate)`. SD 1.5's first down block: dim 320, inner 1280, 4096 tokens (64x64 latents), batch 8."""
import os

import torch
import torch.nn as nn
from diffusers.models.activations import GEGLU

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, TOKENS, DIM, INNER = (2, 8, 32, 64) if SMALL else (8, 4096, 320, 1280)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.geglu = GEGLU(DIM, INNER)
        self.to(DTYPE)

    def forward(self, hidden_states):
        return self.geglu(hidden_states)


def get_inputs():
    return [torch.randn(B, TOKENS, DIM, dtype=DTYPE)]


def get_init_inputs():
    return []
