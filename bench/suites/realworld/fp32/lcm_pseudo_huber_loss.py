"""The pseudo-Huber loss of diffusers' latent consistency distillation scripts (examples/consistency_distillation,
--loss_type huber): `loss = torch.mean(torch.sqrt((model_pred.float() - target.float()) ** 2 + args.huber_c**2) -
args.huber_c)` with huber_c 0.001. SDXL latents: 4 channels at 128x128, batch 16."""
import os

import torch
import torch.nn as nn

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 4, 6, 5) if SMALL else (16, 4, 128, 128)
HUBER_C = 0.001


class Model(nn.Module):
    def forward(self, model_pred, target):
        return torch.mean(torch.sqrt((model_pred.float() - target.float()) ** 2 + HUBER_C**2) - HUBER_C)


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE), torch.randn(N, C, H, W, dtype=DTYPE)]


def get_init_inputs():
    return []
