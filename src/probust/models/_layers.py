"""Layers shared by the architectures."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor, nn


class Normalize(nn.Module):
    """Per-channel ``(x - mean) / std``, the first layer of every probust model.

    Keeping normalisation inside the model means inputs, and so noise ``sigma``, stay in pixel
    units. The statistics are buffers, so they travel with the checkpoint.

    Args:
        channels: number of input channels C.
        mean, std: per-channel statistics (length C, or 1 to broadcast); ``None`` means 0 and 1
            (the identity).
    """

    def __init__(self, channels: int, mean: Sequence[float] | None = None, std: Sequence[float] | None = None) -> None:
        super().__init__()
        mean_t = torch.as_tensor(list(mean) if mean is not None else [0.0], dtype=torch.float32)
        std_t = torch.as_tensor(list(std) if std is not None else [1.0], dtype=torch.float32)
        for label, t in (("mean", mean_t), ("std", std_t)):
            if t.ndim != 1 or t.numel() not in (1, channels):
                raise ValueError(f"{label} must have 1 or {channels} values, got {t.numel()}")
        if (std_t <= 0).any():
            raise ValueError(f"std must be positive, got {std_t.tolist()}")
        self.register_buffer("mean", mean_t.expand(channels).clone().view(1, channels, 1, 1))
        self.register_buffer("std", std_t.expand(channels).clone().view(1, channels, 1, 1))

    mean: Tensor
    std: Tensor

    def forward(self, x: Tensor) -> Tensor:
        """[B, C, H, W] -> [B, C, H, W]."""
        return (x - self.mean) / self.std

    def extra_repr(self) -> str:
        return f"mean={self.mean.flatten().tolist()}, std={self.std.flatten().tolist()}"
