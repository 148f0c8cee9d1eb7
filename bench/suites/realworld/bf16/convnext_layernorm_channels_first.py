"""transformers ConvNextLayerNorm(data_format="channels_first"): a LayerNorm over the channels of an NCHW tensor
(permute, nn.LayerNorm, permute back), as ConvNextEmbeddings and the downsampling layers call it; also the LayerNorm2d
of SAM and ConvNeXt-V2. 16 images, 256 channels at 64x64 (ConvNeXt-base's second stage at 512x512 input)."""
import os

import torch
import torch.nn as nn
from transformers.models.convnext.modeling_convnext import ConvNextLayerNorm

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 16, 6, 5) if SMALL else (16, 256, 64, 64)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.layernorm = ConvNextLayerNorm(C, eps=1e-6, data_format="channels_first")
        with torch.no_grad():
            self.layernorm.weight.normal_(1.0, 0.1)
            self.layernorm.bias.normal_(0.0, 0.1)
        self.to(DTYPE)

    def forward(self, features):
        return self.layernorm(features)


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE)]


def get_init_inputs():
    return []
