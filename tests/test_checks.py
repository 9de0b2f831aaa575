"""probust._checks: the finite-logits test of noisy copies against torch.isfinite."""

from __future__ import annotations

import pytest
import torch

from probust._user_model import check_noisy_logits, finite_rows


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float32, torch.float64])
def test_finite_rows_agrees_with_isfinite_all_including_huge_finite_logits(dtype):
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(60, 7, generator=gen).to(dtype)
    big = torch.finfo(dtype).max
    logits[3] = big  # finite, but a plain row sum would overflow to inf
    logits[4, :3] = -big
    bad = torch.randint(0, 60 * 7, (12,), generator=gen)
    values = torch.tensor([float("nan"), float("inf"), -float("inf")]).repeat(4).to(dtype)
    logits.view(-1)[bad] = values
    expected = torch.isfinite(logits).all(dim=1).view(-1, 3)
    assert torch.equal(finite_rows(logits, 3), expected)
    assert expected[1, 0] and expected[1, 1], "the huge rows are finite and must stay so"


def test_check_noisy_logits_names_points_by_data_set_index_and_counts():
    check_noisy_logits(torch.zeros(3, dtype=torch.long), 100, torch.tensor([7, 8, 9]), "gaussian sigma=0.5")
    with pytest.raises(ValueError) as error:
        check_noisy_logits(torch.tensor([0, 4, 0]), 100, torch.tensor([7, 8, 9]), "gaussian sigma=0.5")
    message = str(error.value)
    assert "point 8: 4 of 100 copies" in message and "gaussian sigma=0.5" in message
    assert "point 7" not in message and "point 9" not in message
    with pytest.raises(ValueError, match=r"point 0: 1 of 5 copies.*point 4: 1 of 5 copies and 2 more points"):
        check_noisy_logits(torch.ones(7, dtype=torch.long), 5, torch.arange(7), "laplace sigma=1.0")
