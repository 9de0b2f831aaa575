"""probust.training.augment: each output image is a padded crop of its input, maybe flipped."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from probust.training.augment import crop_and_flip


def test_augmentation_crops_and_flips_each_image():
    x = torch.rand(6, 3, 8, 8)
    out = crop_and_flip(x, torch.Generator().manual_seed(0), pad=2)
    padded = F.pad(x, (2, 2, 2, 2))
    for i in range(6):
        views = [padded[i, :, dy : dy + 8, dx : dx + 8] for dy in range(5) for dx in range(5)]
        assert any(torch.equal(out[i], v) or torch.equal(out[i], v.flip(-1)) for v in views)
