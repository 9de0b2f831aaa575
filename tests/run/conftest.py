"""Fixtures of the probust.run tests: a tiny data set and model, fast to score."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from probust.data import ImageDataset


@pytest.fixture
def tiny_data() -> ImageDataset:
    """20 random 1x4x4 images of 3 classes named a, b, c."""
    gen = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (20, 1, 4, 4), generator=gen, dtype=torch.uint8)
    labels = torch.randint(0, 3, (20,), generator=gen)
    return ImageDataset(images, labels, name="tiny", split="test", classes=["a", "b", "c"])


@pytest.fixture
def tiny_model() -> nn.Module:
    """A small MLP from [B, 1, 4, 4] to 3 logits."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 8), nn.Tanh(), nn.Linear(8, 3))
