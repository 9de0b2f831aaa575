"""Fixtures of the training tests."""

from __future__ import annotations

import pytest

import probust.data as pdata


@pytest.fixture(scope="module")
def digits():
    """scikit-learn's 8x8 digits: (train split, test split)."""
    return pdata.load("digits", "train"), pdata.load("digits", "test")
