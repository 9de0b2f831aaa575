"""``Estimate``: one row per point, ``Estimate.cat`` of consecutive chunks, ``cpu``."""

from __future__ import annotations

import dataclasses

import pytest
import torch

from probust.estimators import Estimate


def _estimate(rows: int, first: int = 0) -> Estimate:
    values = torch.arange(first, first + rows, dtype=torch.float64)
    return Estimate(
        p=values / 100,
        target=torch.arange(first, first + rows),
        method="mc",
        stderr=values / 1000,
        confidence=0.9,
        z=torch.stack([values, -values], 1),
    )


def test_cat_of_consecutive_chunks_is_the_whole():
    whole = _estimate(7)
    parts = [_estimate(2), _estimate(4, first=2), _estimate(1, first=6)]
    joined = Estimate.cat(parts)
    for field in dataclasses.fields(Estimate):
        a, b = getattr(joined, field.name), getattr(whole, field.name)
        assert torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b, field.name
    assert len(joined) == 7 and joined.ci_low is None and joined.p_mc is None


def test_cat_takes_the_non_tensor_fields_from_the_first_part():
    first, second = _estimate(2), dataclasses.replace(_estimate(3), method="other", confidence=0.5)
    joined = Estimate.cat([first, second])
    assert joined.method == "mc" and joined.confidence == 0.9
    assert torch.equal(Estimate.cat([first]).p, first.p)


def test_cat_refuses_no_parts_by_name():
    with pytest.raises(ValueError, match=r"^parts must hold at least one Estimate"):
        Estimate.cat([])


def test_cpu_is_a_copy_with_every_tensor_on_the_cpu():
    r = _estimate(3)
    moved = r.cpu()
    assert moved is not r and moved.method == r.method and moved.confidence == r.confidence
    for field in dataclasses.fields(Estimate):
        value = getattr(moved, field.name)
        if isinstance(value, torch.Tensor):
            assert value.device.type == "cpu" and torch.equal(value, getattr(r, field.name))
