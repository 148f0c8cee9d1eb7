"""The denoising loss of diffusers' training scripts (examples/text_to_image/train_text_to_image.py, DreamBooth, LoRA):
`loss = F.mse_loss(model_pred.float(), target.float(), reduction="mean")` on the UNet's prediction and the noise (or
v-target). SD3 / Flux latents: 16 channels at 128x128 (1024x1024 images), batch 16."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 4, 6, 5) if SMALL else (16, 16, 128, 128)


class Model(nn.Module):
    def forward(self, model_pred, target):
        return F.mse_loss(model_pred.float(), target.float(), reduction="mean")


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE), torch.randn(N, C, H, W, dtype=DTYPE)]


def get_init_inputs():
    return []
