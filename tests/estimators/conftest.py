"""Fixtures of the estimator tests."""

from __future__ import annotations

import pytest
import torch

from tests._helpers import linear_model


@pytest.fixture
def small():
    return linear_model(4, 3, seed=0), torch.randn(5, 4)
