"""Sums of rows into slots, the same on every run: ``index_add`` without CUDA's atomics.

``total.index_add_(0, index, values)`` adds row i of ``values`` into slot ``index[i]``. On the
CPU the adds into one slot run in the rows' order, so the result is the same on every call. On
CUDA, rows that share a slot are added by atomics in whatever order the threads arrive: float
sums then differ in their last bits from one call to the next, and so would MMSE's averaged
gradients, and every p built on them. :func:`add_rows` keeps the CPU's order on every device.
"""

from __future__ import annotations

import torch
from torch import Tensor


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


__all__ = ["add_rows"]
