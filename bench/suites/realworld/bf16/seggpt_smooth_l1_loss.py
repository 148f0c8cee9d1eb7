"""transformers SegGptLoss (transformers.models.seggpt.modeling_seggpt): the smooth-L1 loss over the masked patches, as
SegGptForImageSegmentation calls `loss_fn(prompt_masks, pred_masks, labels, bool_masked_pos)`: prompt and label masks
concatenated along the height, the patch mask unpatchified to pixels, `F.smooth_l1_loss(pred_masks, ground_truth,
reduction="none", beta=0.01)`, then `(loss * mask).sum() / mask.sum()`. SegGPT-vit-large: 448x448 images,
16-pixel patches, batch 8."""
import os

import torch
import torch.nn as nn
from transformers import SegGptConfig
from transformers.models.seggpt.modeling_seggpt import SegGptLoss

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
B, SIZE, PATCH = (2, 8, 4) if SMALL else (8, 448, 16)


class Model(nn.Module):
    def __init__(self):
        super().__init__()
        self.loss_fn = SegGptLoss(SegGptConfig(patch_size=PATCH, beta=0.01))

    def forward(self, prompt_masks, pred_masks, labels, bool_masked_pos):
        return self.loss_fn(prompt_masks, pred_masks, labels, bool_masked_pos)


def get_inputs():
    patches = (2 * SIZE // PATCH) * (SIZE // PATCH)
    bool_masked_pos = torch.zeros(B, patches, dtype=torch.bool)
    bool_masked_pos[:, patches // 2 :] = True  # the label half is predicted
    return [torch.rand(B, 3, SIZE, SIZE, dtype=DTYPE), torch.rand(B, 3, 2 * SIZE, SIZE, dtype=DTYPE),
            torch.rand(B, 3, SIZE, SIZE, dtype=DTYPE), bool_masked_pos]


def get_init_inputs():
    return []
