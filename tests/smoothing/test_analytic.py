"""Radius estimates from the analytic estimators: sigma * Phi^-1(p), exact where p is."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
from probust.smoothing import radius_estimate
from tests._helpers import linear_model


def _distance(model: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """Signed distance of each point to the boundary (> 0 on class 0's side): the true radius."""
    w = (model.weight[0] - model.weight[1]).detach().double()
    return (x.double() @ w + float((model.bias[0] - model.bias[1]).detach())) / w.norm()


@pytest.mark.parametrize("method", ["taylor", "mmse"])
def test_the_estimate_is_the_distance_to_the_boundary_for_a_linear_model(method):
    # For a linear two-class model Taylor and MMSE are exact, and the smoothed classifier's
    # radius is the distance to the boundary: sigma * Phi^-1(p) recovers it.
    model, sigma = linear_model(6, 2), 0.4
    x = torch.randn(20, 6, generator=torch.Generator().manual_seed(1)) * 0.5
    est = probust.make_estimator(method, model, sigma)(x)
    distance = _distance(model, x) * torch.where(est.target == 0, 1.0, -1.0).double()
    got = radius_estimate(est, sigma)
    torch.testing.assert_close(got, distance.clamp_min(0.0), rtol=1e-5, atol=1e-5)


def test_no_radius_where_the_class_is_kept_with_p_below_one_half():
    model, sigma = linear_model(6, 2), 0.4
    x = torch.randn(10, 6, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        other = 1 - model(x).argmax(1)
    est = probust.Taylor(model, sigma)(x, other)
    assert (est.p < 0.5).all()
    assert (radius_estimate(est, sigma) == 0).all()


def test_far_points_keep_their_digits_through_p_fail():
    # 12 sigma from the boundary p rounds to 1 (Phi^-1(1) = inf); the failure probability keeps it.
    model, sigma = linear_model(6, 2), 0.1
    w = (model.weight[0] - model.weight[1]).detach()
    b = float((model.bias[0] - model.bias[1]).detach())
    x = ((12 * sigma * w.norm() - b) / w.norm() ** 2 * w)[None, :]
    est = probust.Taylor(model, sigma, p_fail=True)(x)
    assert est.p.item() == 1.0
    assert radius_estimate(est, sigma).item() == pytest.approx(12 * sigma, rel=1e-6)
    assert radius_estimate(probust.Taylor(model, sigma)(x), sigma).item() == float("inf")


def test_softmax_and_other_noise_are_refused():
    model, x = linear_model(6, 2), torch.randn(3, 6)
    with pytest.raises(ValueError, match="softmax"):
        radius_estimate(probust.Softmax(model)(x), 0.3)
    est = probust.Taylor(model, 0.3)(x)
    with pytest.raises(ValueError, match="isotropic"):
        radius_estimate(est, probust.Gaussian(torch.full((6,), 0.3)))
    with pytest.raises(ValueError, match="Laplace"):
        radius_estimate(est, probust.Laplace(0.3))
    with pytest.raises(ValueError, match="estimate"):
        radius_estimate(est.p, 0.3)  # type: ignore[arg-type]
