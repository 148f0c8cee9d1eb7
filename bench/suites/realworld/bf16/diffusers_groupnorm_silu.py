"""diffusers ResnetBlock2D's norm and activation: `hidden_states = self.norm1(input_tensor); hidden_states =
self.nonlinearity(hidden_states)` (GroupNorm with 32 groups, eps 1e-6, then SiLU) before its first convolution, as in
every UNet2DConditionModel and AutoencoderKL block. Stable Diffusion's VAE decoder: 512 channels at 64x64, batch 8
(a second shape: 4 images at 96x96)."""
import os

import torch
import torch.nn as nn
from diffusers.models.resnet import ResnetBlock2D

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 64, 6, 5) if SMALL else (8, 512, 64, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.block = ResnetBlock2D(in_channels=C, out_channels=C, temb_channels=None, groups=32, eps=1e-6)
        with torch.no_grad():
            self.block.norm1.weight.normal_(1.0, 0.1)
            self.block.norm1.bias.normal_(0.0, 0.1)
        del self.block.conv1, self.block.conv2, self.block.norm2  # the convolutions are not this problem's
        self.to(DTYPE)

    def forward(self, input_tensor):
        hidden_states = self.block.norm1(input_tensor)
        hidden_states = self.block.nonlinearity(hidden_states)
        return hidden_states


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE)]


def get_second_inputs():
    return [torch.randn(N // 2, C, H * 3 // 2, W * 3 // 2, dtype=DTYPE)]


def get_init_inputs():
    return []
