"""probust.experiments.robust_training_tables: the numbers of experiment 11."""

from __future__ import annotations

import numpy as np
import pytest

from probust.experiments.robust_training_tables import frontier_mask, interpolate


def test_interpolate_matches_numpy_inside_and_refuses_outside():
    x, y = np.array([0.80, 0.83, 0.86]), np.array([0.99, 0.90, 0.93])
    for at in (0.80, 0.81, 0.83, 0.85, 0.86):
        value, k, w = interpolate(x, y, at)
        assert value == pytest.approx(np.interp(at, x, y)) and x[k] <= at <= x[k + 1] and 0 <= w <= 1
    assert np.isnan(interpolate(x, y, 0.79)[0]) and interpolate(x, y, 0.87)[1] is None


def test_frontier_keeps_exactly_the_points_no_other_point_beats_on_both():
    rng = np.random.default_rng(3)
    acc = rng.choice([0.80, 0.82, 0.84, 0.86], size=12)
    med = rng.choice([0.5, 0.6, 0.7, 0.8], size=12)
    mask = frontier_mask(acc, med)
    for i in range(len(acc)):
        beaten = any(
            acc[j] >= acc[i] and med[j] >= med[i] and (acc[j] > acc[i] or med[j] > med[i]) for j in range(len(acc))
        )
        assert mask[i] == (not beaten)
