"""torchvision sigmoid_focal_loss (torchvision.ops.focal_loss), RetinaNet's classification loss as
RetinaNetClassificationHead.compute_loss calls it: `sigmoid_focal_loss(cls_logits, gt_classes_target,
reduction="sum")` (alpha 0.25, gamma 2), with one-hot targets (most anchors are background: all zeros).
RetinaNet-ResNet-50-FPN at 800x1088, 91 COCO classes: 9 anchors per position on the 100x136 to 7x9 levels, 163206
anchors per image; the anchors of a batch of 2 in one call."""
import os

import torch
import torch.nn as nn
from torchvision.ops import sigmoid_focal_loss

DTYPE = torch.bfloat16
SMALL = os.environ.get("REALWORLD_SUITE_SMALL") == "1"  # CI's sizes (bench/suites/realworld/README.md)
ANCHORS, CLASSES = (2 * 96, 12) if SMALL else (2 * 163206, 91)


class Model(nn.Module):
    def forward(self, cls_logits, gt_classes_target):
        return sigmoid_focal_loss(cls_logits, gt_classes_target, reduction="sum")


def get_inputs():
    labels = torch.randint(0, CLASSES, (ANCHORS,))
    foreground = torch.rand(ANCHORS) < 0.01
    target = torch.zeros(ANCHORS, CLASSES, dtype=DTYPE)
    target[foreground, labels[foreground]] = 1.0
    return [torch.randn(ANCHORS, CLASSES, dtype=DTYPE) * 2 - 4, target]


def get_init_inputs():
    return []
