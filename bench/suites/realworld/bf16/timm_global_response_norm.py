"""timm GlobalResponseNorm (timm.layers.grn), the GRN of ConvNeXt-V2's blocks (GlobalResponseNormMlp), channels
last: the L2 norm of each channel over the image (dims 1, 2), divided by its mean over the channels, then
`addcmul(bias, weight * norm + 1, x)`. It follows the MLP's first Linear and GELU, so it sees 4x the block's width.
ConvNeXt-V2-base at 224x224, a batch of 64: the third stage, 14x14 positions of 4 x 512 channels."""
import os

import torch
import torch.nn as nn
from timm.layers import GlobalResponseNorm

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, H, W, C = (2, 5, 6, 32) if SMALL else (64, 14, 14, 2048)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.grn = GlobalResponseNorm(C, eps=1e-6, channels_last=True)
        with torch.no_grad():
            self.grn.weight.normal_(0.0, 0.1)
            self.grn.bias.normal_(0.0, 0.1)
        self.to(DTYPE)

    def forward(self, x):
        return self.grn(x)


def get_inputs():
    return [torch.randn(N, H, W, C, dtype=DTYPE)]


def get_init_inputs():
    return []
