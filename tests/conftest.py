"""Shared fixtures: small models whose exact p_robust is known."""

from __future__ import annotations

import pytest
import torch

from tests._helpers import linear_model


@pytest.fixture(autouse=True)
def one_thread():
    # Two OpenMP threads on a shared 2-core machine are many times slower than one.
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)


@pytest.fixture(autouse=True)
def no_plan_cache_on_disk(monkeypatch):
    # Measured execution plans persist in ~/.cache by default: tests neither read nor write it
    # (a test that needs the disk cache points PROBUST_CACHE_DIR at its own folder).
    monkeypatch.setenv("PROBUST_CACHE_DIR", "off")


@pytest.fixture
def make_linear():
    return linear_model
