"""torchvision FrozenBatchNorm2d (torchvision.ops.misc), the norm layer of the ResNet backbones torchvision's
detection models build (`norm_layer=misc_nn_ops.FrozenBatchNorm2d`): fixed statistics and affine, `x * scale + bias`
with `scale = weight * (running_var + eps).rsqrt()` per channel. Mask R-CNN's ResNet-50 at 800x1088, a batch of 2:
the first stage's 256 channels at 200x272."""
import os

import torch
import torch.nn as nn
from torchvision.ops.misc import FrozenBatchNorm2d

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 16, 6, 5) if SMALL else (2, 256, 200, 272)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = FrozenBatchNorm2d(C)
        with torch.no_grad():
            self.bn.weight.normal_(1.0, 0.1)
            self.bn.bias.normal_(0.0, 0.1)
            self.bn.running_mean.normal_(0.0, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
        self.to(DTYPE)

    def forward(self, x):
        return self.bn(x)


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE)]


def get_init_inputs():
    return []
