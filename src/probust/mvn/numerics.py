"""Numerical primitives whose rounding does not depend on the batch or the device.

:func:`tree_sum` sums in an order set by the summed length only; :func:`add_rows` is
``index_add`` with each slot's adds in the rows' order on every device. On CUDA,
``index_add_`` adds rows that share a slot by atomics in whatever order the threads arrive, so
float sums would differ in their last bits from call to call (and so would MMSE's averaged
gradients and every p built on them).
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["add_rows", "ndtr", "tree_sum"]

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


def add_rows(total: Tensor, index: Tensor, values: Tensor, *, inplace: bool = True) -> Tensor:
    """``total.index_add_(0, index, values)`` (or ``index_add`` with ``inplace=False``, which
    keeps autograd's graph through ``total``), with each slot's adds in the order of the rows, on
    every device: the same bits on every call.

    Args:
        total: [S, *T], the slots (float or int).
        index: int64 [R], each row's slot in [0, S), in any order, repeats allowed.
        values: [R, *T].

    Returns:
        ``total`` (modified) if ``inplace``, else a new tensor.
    """
    if total.device.type == "cpu" or not (total.is_floating_point() or total.is_complex()):
        # Sequential on the CPU; integer sums do not depend on the order.
        return total.index_add_(0, index, values) if inplace else total.index_add(0, index, values)
    return _by_rank(total, index, values, inplace)


def _by_rank(total: Tensor, index: Tensor, values: Tensor, inplace: bool) -> Tensor:
    """One ``index_add`` per rank: the k-th row of each slot (in row order) in the k-th call.
    Within a call no slot repeats, so no two threads add into one place; the calls run in rank
    order, so each slot sums its rows in their order, as the CPU does."""
    if index.numel() == 0:
        return total
    sorted_index, order = torch.sort(index, stable=True)
    first = torch.searchsorted(sorted_index, sorted_index, right=False)
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), device=index.device) - first
    for k in range(int(rank.max()) + 1):
        rows = (rank == k).nonzero().flatten()
        if inplace:
            total.index_add_(0, index[rows], values[rows])
        else:
            total = total.index_add(0, index[rows], values[rows])
    return total
