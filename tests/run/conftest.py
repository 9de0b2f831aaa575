"""Fixtures of the probust.run tests: a tiny data set and model, fast to score."""

from __future__ import annotations

import pytest
from torch import nn

from probust.data import ImageDataset
from tests import _helpers


@pytest.fixture
def tiny_data() -> ImageDataset:
    """20 random 1x4x4 images of 3 classes named a, b, c."""
    return _helpers.tiny_data()


@pytest.fixture
def tiny_model() -> nn.Module:
    """A small MLP from [B, 1, 4, 4] to 3 logits."""
    return _helpers.tiny_model()
