"""probust.mvn.add_rows: index_add with each slot's adds in the rows' order on every device.

Oracle: the CPU's ``index_add_``, which adds into one slot in the rows' order. The rank-by-rank
path that CUDA takes runs here on the CPU (``_by_rank``): the same bits as ``index_add_`` where
slots repeat, in any order, and the same graph where out of place. The CUDA suite checks the
bitwise repetition it exists for (tests/cuda)."""

from __future__ import annotations

import pytest
import torch

from probust.mvn.numerics import _by_rank, add_rows


def _case(seed: int, rows: int, slots: int, shape: tuple[int, ...]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    index = torch.randint(0, slots, (rows,), generator=gen)
    # Values of very different sizes: the order of the adds shows in the last bits.
    values = torch.randn(rows, *shape, generator=gen) * 10.0 ** torch.randint(-6, 7, (rows, *shape), generator=gen)
    total = torch.randn(slots, *shape, generator=gen)
    return total, index, values


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("rows", "slots", "shape"), [(40, 7, (3, 5)), (1, 1, ()), (200, 3, (2,)), (9, 20, (4,))])
def test_rank_by_rank_sums_equal_the_sequential_index_add_bitwise(rows, slots, shape, dtype):
    total, index, values = _case(rows + slots, rows, slots, shape)
    total, values = total.to(dtype), values.to(dtype)
    expected = total.clone().index_add_(0, index, values)
    # A sum in another order differs (else the test could not tell the order).
    assert rows < 40 or not torch.equal(expected, total.clone().index_add_(0, index.flip(0), values.flip(0)))
    assert torch.equal(_by_rank(total.clone(), index, values, inplace=True), expected)
    assert torch.equal(_by_rank(total.clone(), index, values, inplace=False), expected)


def test_sorted_copies_of_points_as_mmse_sums_them():
    # MMSE's rows: each point's copies in a run (repeat_interleave), split over blocks.
    total, _, values = _case(1, 30, 6, (4,))
    index = torch.arange(6).repeat_interleave(5)
    expected = total.clone().index_add_(0, index, values)
    got = total.clone()
    for block in (slice(0, 7), slice(7, 19), slice(19, 30)):
        got = _by_rank(got, index[block], values[block], inplace=True)
    assert torch.equal(got, expected)


def test_out_of_place_keeps_the_graph_and_leaves_the_total():
    total, index, values = _case(2, 12, 4, (3,))
    values.requires_grad_(True)
    before = total.clone()
    out = _by_rank(total, index, values, inplace=False)
    assert torch.equal(total, before)
    weights = torch.randn(4, 3, generator=torch.Generator().manual_seed(3))
    (grad,) = torch.autograd.grad((out * weights).sum(), values)
    assert torch.equal(grad, weights[index])


def test_no_rows_and_integer_sums():
    total = torch.ones(3)
    assert torch.equal(_by_rank(total, torch.zeros(0, dtype=torch.long), torch.zeros(0), inplace=True), torch.ones(3))
    counts = add_rows(torch.zeros(4, dtype=torch.long), torch.tensor([3, 0, 3, 3]), torch.ones(4, dtype=torch.long))
    assert counts.tolist() == [1, 0, 0, 3]
