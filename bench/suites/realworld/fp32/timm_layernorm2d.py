"""timm LayerNorm2d (timm.layers.norm): the LayerNorm over the channels of an NCHW tensor that timm's ConvNeXt uses
in its stem and downsampling layers (`norm_layer(dims[0])` after the 4x4 stem conv), eps 1e-6, affine. ConvNeXt-base
at 224x224, a training batch of 128: 128 channels at 56x56."""
import os

import torch
import torch.nn as nn
from timm.layers import LayerNorm2d

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 16, 6, 5) if SMALL else (128, 128, 56, 56)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.norm = LayerNorm2d(C, eps=1e-6)
        with torch.no_grad():
            self.norm.weight.normal_(1.0, 0.1)
            self.norm.bias.normal_(0.0, 0.1)
        self.to(DTYPE)

    def forward(self, x):
        return self.norm(x)


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE)]


def get_init_inputs():
    return []
