"""Small failure probabilities: mvn_sf, r.p_fail of the analytic estimators, importance sampling.

Oracles: closed forms (k = 1; orthogonal boundaries, 1 - prod Phi(z_i) computed with log1p/expm1),
one-dimensional integrals by scipy's adaptive quadrature at relative tolerance 1e-12 (bivariate;
equicorrelated k = 6), and long plain Monte Carlo for a non-linear model.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats
from torch import nn

import probust
from probust.tails import mvn_sf

from tests.conftest import linear_model

F64 = torch.float64



def _orthogonal_fail(z: np.ndarray) -> float:
    """1 - prod Phi(z_i) = -expm1(sum log1p(-Phi(-z_i))): no cancellation."""
    return float(-np.expm1(np.sum(np.log1p(-special.ndtr(-z)))))


def _bivariate_fail(z1: float, z2: float, r: float) -> float:
    """P(Y1 > z1 or Y2 > z2) = Phi(-z1) + int_{-inf}^{z1} phi(t) Phi(-(z2 - r t) / s) dt."""
    s = math.sqrt((1 - r) * (1 + r))
    inner, _ = integrate.quad(
        lambda t: stats.norm.pdf(t) * special.ndtr(-(z2 - r * t) / s), -np.inf, z1, epsabs=0, epsrel=1e-12, limit=200
    )
    return float(special.ndtr(-z1) + inner)


def _equicorrelated_fail(z: np.ndarray, rho: float) -> float:
    """Y_i = sqrt(rho) W + sqrt(1 - rho) E_i: integrate 1 - prod Phi over W (quadrature)."""
    a, b = math.sqrt(rho), math.sqrt(1 - rho)

    def given(w: float) -> float:
        tails = special.ndtr(-(z - a * w) / b)
        return stats.norm.pdf(w) * _orthogonal_fail_from_tails(tails)

    return integrate.quad(given, -np.inf, np.inf, epsabs=0, epsrel=1e-12, limit=400)[0]


def _orthogonal_fail_from_tails(tails: np.ndarray) -> float:
    return float(-np.expm1(np.sum(np.log1p(-np.minimum(tails, 1.0 - 1e-16)))))


@pytest.mark.parametrize("z", [0.5, 3.0, 5.0, 6.0, 7.0])
def test_sf_k1_is_the_normal_tail_to_relative_precision(z):
    # variance 4, bound 2 z: z standard deviations
    p, rel = mvn_sf(torch.tensor([2.0 * z], dtype=F64), torch.eye(1, dtype=F64) * 4.0, return_error=True)
    expected = special.ndtr(-z)
    assert abs(p.item() / expected - 1) < 1e-10
    assert rel.item() < 1e-10


@pytest.mark.parametrize(
    "z1, z2, r",
    [(1.0, 2.0, 0.3), (3.0, 4.0, 0.5), (7.0, 7.0, 0.9), (7.0, 7.2, -0.9), (6.5, 7.0, 0.0), (7.0, 8.0, 0.99), (7.0, 7.0, 0.999)],
)
def test_sf_k2_matches_the_bivariate_integral_to_one_percent_down_to_1e_12(z1, z2, r):
    upper = torch.tensor([z1, z2], dtype=F64)
    cov = torch.tensor([[1.0, r], [r, 1.0]], dtype=F64)
    p, rel = mvn_sf(upper, cov, rtol=1e-2, return_error=True)
    expected = _bivariate_fail(z1, z2, r)
    actual = abs(p.item() / expected - 1)
    assert actual < 1e-2, (p.item(), expected)
    assert actual <= max(rel.item(), 1e-12), "the reported relative error must bound the actual one"


def test_sf_orthogonal_boundaries_equal_one_minus_the_product_down_to_1e_12():
    z = np.array([[6.8, 7.0, 7.1, 7.3, 7.5], [2.0, 2.5, 3.0, 4.0, 5.0], [5.5, 6.0, 6.2, 6.4, 9.0]])
    p, rel = mvn_sf(torch.tensor(z, dtype=F64), torch.eye(5, dtype=F64).expand(3, 5, 5), return_error=True)
    expected = np.array([_orthogonal_fail(row) for row in z])
    assert expected[0] < 1e-11
    np.testing.assert_allclose(p.numpy(), expected, rtol=1e-2)
    assert (np.abs(p.numpy() / expected - 1) <= np.maximum(rel.numpy(), 1e-12)).all()


@pytest.mark.parametrize("rho, z", [(0.5, [6.5, 6.7, 6.9, 7.0, 7.2, 7.4]), (0.3, [2, 2.5, 3, 3, 3.5, 4]), (0.9, [7.0] * 6)])
def test_sf_equicorrelated_k6_matches_the_one_dimensional_integral(rho, z):
    k = len(z)
    corr = torch.full((k, k), rho, dtype=F64)
    corr.fill_diagonal_(1.0)
    p, rel = mvn_sf(torch.tensor(z, dtype=F64), corr, rtol=1e-2, return_error=True)
    expected = _equicorrelated_fail(np.array(z, dtype=float), rho)
    assert abs(p.item() / expected - 1) < 1e-2, (p.item(), expected)
    assert rel.item() < 1e-2


def test_sf_is_one_minus_cdf_where_both_are_accurate():
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(4, 5, 5, generator=gen, dtype=F64)
    cov = a @ a.mT + 0.1 * torch.eye(5, dtype=F64)
    upper = torch.randn(4, 5, generator=gen, dtype=F64)
    p_fail, rel = mvn_sf(upper, cov, rtol=1e-3, return_error=True)
    p, err = probust.mvn_cdf(upper, cov, tol=1e-5, return_error=True)
    # each within its own (about 99%) error bound
    assert ((p_fail - (1 - p)).abs() <= rel * p_fail + err).all(), (p_fail, 1 - p, rel * p_fail, err)
    assert (rel < 1e-3).all()


def test_sf_edge_cases_are_exact():
    cov = torch.eye(3, dtype=F64)
    upper = torch.tensor([[math.inf] * 3, [1.0, -math.inf, 2.0], [math.inf, 3.0, math.inf]], dtype=F64)
    p, rel = mvn_sf(upper, cov, return_error=True)
    assert p[0] == 0 and p[1] == 1 and rel[0] == 0 and rel[1] == 0
    assert abs(p[2].item() / special.ndtr(-3.0) - 1) < 1e-12
    # a zero-variance coordinate is crossed exactly when its bound is negative
    frozen = torch.diag(torch.tensor([0.0, 1.0], dtype=F64))
    assert mvn_sf(torch.tensor([-0.1, 9.0], dtype=F64), frozen) == 1
    assert abs(mvn_sf(torch.tensor([0.1, 6.0], dtype=F64), frozen).item() / special.ndtr(-6.0) - 1) < 1e-12


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


def test_binary_p_fail_is_the_normal_tail():
    model = linear_model(12, 2, seed=3)
    x = torch.randn(5, 12, generator=torch.Generator().manual_seed(0))
    r = probust.Taylor(model, 0.05, p_fail=True)(x)
    z = r.z.gather(1, (1 - r.target)[:, None]).squeeze(1)
    expected = special.ndtr(-z.numpy())
    np.testing.assert_allclose(r.p_fail.numpy(), expected, rtol=1e-9)


def test_mv_sigmoid_p_fail_is_the_closed_form_complement():
    model = linear_model(8, 5, seed=4)
    x = torch.randn(4, 8, generator=torch.Generator().manual_seed(2))
    r = probust.Taylor(model, 0.02, cdf="mv-sigmoid", p_fail=True)(x)
    s = torch.where(r.z.isfinite(), torch.exp(-r.z), 0.0).sum(1)
    torch.testing.assert_close(r.p_fail, s / (1 + s), rtol=1e-12, atol=0)
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
