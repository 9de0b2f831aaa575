"""Small failure probabilities of the estimators: r.p_fail of the analytic maps, importance sampling.

Oracles: closed forms (orthogonal boundaries, 1 - prod Phi(z_i) computed with log1p/expm1; the
binary normal tail; the mv-sigmoid's complement) and long plain Monte Carlo for a non-linear model.
(mvn_sf itself is tested in tests/mvn/test_sf.py.)
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import special
from torch import nn

import probust
from tests._helpers import linear_model

F64 = torch.float64


def _orthogonal_fail(z: np.ndarray) -> float:
    """1 - prod Phi(z_i) = -expm1(sum log1p(-Phi(-z_i))): no cancellation."""
    return float(-np.expm1(np.sum(np.log1p(-special.ndtr(-z)))))


# ---- r.p_fail of the analytic estimators ------------------------------------------------------


def _orthogonal_linear_model(d: int, scales: list[float]) -> nn.Linear:
    """Class 0's logit is 0, class i's is -scales[i-1] * x_i: boundary normals u_i = scales e_i."""
    model = nn.Linear(d, len(scales) + 1)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.zero_()
        for i, s in enumerate(scales):
            model.weight[i + 1, i] = -s
    return model


def test_taylor_p_fail_is_one_minus_prod_phi_for_orthogonal_boundaries():
    d, sigma = 6, 0.1
    scales = [1.0, 2.0, 0.5, 1.5]
    model = _orthogonal_linear_model(d, scales)
    # margins c_i = s_i x_i, ||u_i|| = s_i: z_i = x_i / sigma
    z = torch.tensor([[6.9, 7.0, 7.2, 7.4], [2.0, 3.0, 4.0, 5.0]])
    x = torch.zeros(2, d)
    x[:, :4] = z * sigma
    target = torch.zeros(2, dtype=torch.long)
    for estimator in (probust.Taylor(model, sigma, p_fail=True), probust.MMSE(model, sigma, n_samples=4, p_fail=True)):
        r = estimator(x, target)
        expected = np.array([_orthogonal_fail(row) for row in z.double().numpy()])
        assert expected[0] < 2e-11
        np.testing.assert_allclose(r.p_fail.numpy(), expected, rtol=1e-2)
        assert (r.p_fail_error < 1e-2).all()


def _standardised_margins(model: nn.Linear, x: torch.Tensor, sigma: float) -> tuple[np.ndarray, np.ndarray]:
    """From the weights, in float64 numpy, never through probust: the predicted class t [B] and
    z_i = (f_t(x) - f_i(x)) / (sigma ||w_t - w_i||) [B, C] (+inf at i = t)."""
    w, b = model.weight.detach().double().numpy(), model.bias.detach().double().numpy()
    logits = x.double().numpy() @ w.T + b
    t = logits.argmax(1)
    margins = logits[np.arange(len(x)), t][:, None] - logits
    norms = np.linalg.norm(w[t][:, None, :] - w[None, :, :], axis=2)
    z = np.full(margins.shape, np.inf)
    other = norms > 0
    z[other] = margins[other] / (sigma * norms[other])
    return t, z


def test_binary_p_fail_is_the_normal_tail():
    # A float64 model, so that the estimator's margins carry no float32 rounding and the oracle's
    # z (computed from the weights) is the same number to ~1e-15.
    model = linear_model(12, 2, seed=3).double()
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(0), dtype=F64)
    r = probust.Taylor(model, 0.05, p_fail=True)(x)
    t, z = _standardised_margins(model, x, 0.05)
    assert np.array_equal(r.target.numpy(), t)
    expected = special.ndtr(-z[np.arange(5), 1 - t])
    assert (expected < 0.5).all() and (expected > 0).any()  # down to 1e-188 and an underflow to 0
    np.testing.assert_allclose(r.p_fail.numpy(), expected, rtol=1e-9)


def test_mv_sigmoid_p_fail_is_the_closed_form_complement():
    model = linear_model(8, 5, seed=4).double()
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2), dtype=F64)
    r = probust.Taylor(model, 0.02, cdf="mv-sigmoid", p_fail=True)(x)
    t, z = _standardised_margins(model, x, 0.02)
    assert np.array_equal(r.target.numpy(), t)
    s = np.exp(-z).sum(1)  # exp(-inf) = 0 at the target
    np.testing.assert_allclose(r.p_fail.numpy(), s / (1 + s), rtol=1e-10, atol=0)
    assert (r.p_fail_error == 0).all()


# ---- importance-sampled Monte Carlo -----------------------------------------------------------


def test_importance_sampling_resolves_a_1e_12_binary_tail():
    d, sigma = 10, 0.1
    model = linear_model(d, 2, seed=1)
    w = (model.weight[0] - model.weight[1]).detach()
    # put x where the margin is 7 noise standard deviations: p_fail = Phi(-7) ~ 1.3e-12
    with torch.no_grad():
        b = (model.bias[0] - model.bias[1]).item()
    x = (7.0 * sigma * w.norm() - b) * w / w.norm() ** 2
    r = probust.MonteCarloIS(model, sigma, n_samples=6000)(x[None], torch.tensor([0]))
    expected = special.ndtr(-7.0)
    se = r.p_fail_error.item() * r.p_fail.item()
    assert abs(r.p_fail.item() - expected) < 4 * se
    # the shifted proposal's relative variance per draw grows like z (about 10 at z = 7)
    assert r.p_fail_error.item() < 0.08


def test_importance_sampling_matches_the_closed_form_with_several_boundaries():
    d, sigma = 6, 0.1
    model = _orthogonal_linear_model(d, [1.0, 2.0, 0.5, 1.5])
    z = torch.tensor([[5.0, 5.2, 5.5, 6.0], [6.0, 6.0, 6.0, 6.0]])
    x = torch.zeros(2, d)
    x[:, :4] = z * sigma
    r = probust.MonteCarloIS(model, sigma, n_samples=4000, seed=3)(x, torch.zeros(2, dtype=torch.long))
    expected = torch.tensor([_orthogonal_fail(row) for row in z.double().numpy()], dtype=F64)
    se = r.p_fail_error * r.p_fail
    assert ((r.p_fail - expected).abs() < 4 * se).all(), (r.p_fail, expected, se)
    assert (r.p_fail_error < 0.05).all()
    assert torch.allclose(r.p, 1 - r.p_fail)


class _Bumpy(nn.Module):
    """A non-linear binary model: g(x) = c + w.x - a ||x||^2 + b sin(3 v.x)."""

    def __init__(self, d: int):
        super().__init__()
        gen = torch.Generator().manual_seed(5)
        self.register_buffer("w", torch.nn.functional.normalize(torch.randn(d, generator=gen), dim=0))
        self.register_buffer("v", torch.nn.functional.normalize(torch.randn(d, generator=gen), dim=0))

    def forward(self, x):
        g = 0.25 + x @ self.w - 0.5 * (x * x).sum(1) + 0.05 * torch.sin(3 * x @ self.v)
        return torch.stack([g, torch.zeros_like(g)], dim=1)


def test_importance_sampling_is_unbiased_for_a_non_linear_model():
    d, sigma = 8, 0.1
    model = _Bumpy(d)
    x = torch.zeros(3, d)
    x[1] = 0.02 * model.v
    x[2] = -0.02 * model.w
    target = torch.zeros(3, dtype=torch.long)
    ref = probust.MonteCarlo(model, sigma, n_samples=400_000, seed=11, confidence=0.999)(x, target)
    assert ((1 - ref.p > 1e-3) & (1 - ref.p < 0.05)).all(), "the test wants small but visible p_fail"
    r = probust.MonteCarloIS(model, sigma, n_samples=20_000, seed=2)(x, target)
    ref_se = torch.sqrt(ref.p * (1 - ref.p) / 400_000)
    se = r.p_fail_error * r.p_fail
    assert ((r.p_fail - (1 - ref.p)).abs() < 4 * torch.sqrt(se**2 + ref_se**2)).all(), (r.p_fail, 1 - ref.p)


def test_importance_sampling_refuses_non_gaussian_noise():
    with pytest.raises(ValueError, match="Gaussian"):
        probust.MonteCarloIS(linear_model(4, 3), probust.Uniform(0.1))
