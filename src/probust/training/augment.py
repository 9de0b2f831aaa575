"""Data augmentation for training: random crop and flip, drawn from a given generator."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def crop_and_flip(x: Tensor, gen: torch.Generator, pad: int = 4) -> Tensor:
    """Random crop with zero padding and horizontal flip, per image: the standard CIFAR recipe.

    Args:
        x: images ``[B, C, H, W]``.
        gen: CPU generator the offsets and flips are drawn from (2 randint and 1 rand call of
            ``B`` values each, in that order).
        pad: zero padding on each side; the crop offset is uniform in ``0..2*pad`` per axis.

    Returns:
        ``[B, C, H, W]`` on ``x``'s device, contiguous.
    """
    b, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    flip = torch.rand(b, generator=gen) < 0.5
    rows = (dy[:, None] + torch.arange(h)[None, :]).to(x.device)
    cols = (dx[:, None] + torch.arange(w)[None, :]).to(x.device)
    cols = torch.where(flip.to(x.device)[:, None], cols.flip(1), cols)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()
