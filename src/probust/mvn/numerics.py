"""Numerical primitives of the mvn package whose rounding does not depend on the batch."""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["ndtr", "tree_sum"]

_SQRT1_2 = math.sqrt(0.5)


def ndtr(x: Tensor) -> Tensor:
    """Standard normal CDF Phi(x) = erfc(-x / sqrt(2)) / 2, elementwise, with full relative
    accuracy in the lower tail (unlike torch.special.ndtr there: docs/mvn.md)."""
    return 0.5 * torch.erfc(x * -_SQRT1_2)


def tree_sum(x: Tensor, dim: int = -1) -> Tensor:
    """Sum over ``dim`` by pairwise halving: its rounding depends only on that dim's length.

    torch.sum's order can depend on the shape of the other dims (threads, vector lanes, device),
    which would make a point's value depend on its batch.
    """
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    if n == 0:
        return x.new_zeros(x.shape[:-1])
    size = 1 << (n - 1).bit_length()
    if size != n:
        x = torch.nn.functional.pad(x, (0, size - n))
    while size > 1:
        size //= 2
        x = x[..., :size] + x[..., size:]
    return x[..., 0]
