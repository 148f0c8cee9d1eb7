"""The Min-SNR weighted denoising loss of diffusers' training scripts (train_text_to_image.py with --snr_gamma):
`loss = F.mse_loss(model_pred.float(), target.float(), reduction="none"); loss = loss.mean(dim=list(range(1,
len(loss.shape)))) * mse_loss_weights; loss = loss.mean()` - a mean per sample, weighted, then a mean of means.
SDXL latents: 4 channels at 128x128, batch 16."""
import os

import torch
import torch.nn as nn
import torch.nn.functional as F

DTYPE = torch.float32
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
N, C, H, W = (2, 4, 6, 5) if SMALL else (16, 4, 128, 128)


class Model(nn.Module):
    def forward(self, model_pred, target, mse_loss_weights):
        loss = F.mse_loss(model_pred.float(), target.float(), reduction="none")
        loss = loss.mean(dim=list(range(1, len(loss.shape)))) * mse_loss_weights
        return loss.mean()


def get_inputs():
    return [torch.randn(N, C, H, W, dtype=DTYPE), torch.randn(N, C, H, W, dtype=DTYPE),
            torch.rand(N, dtype=torch.float32)]


def get_init_inputs():
    return []
