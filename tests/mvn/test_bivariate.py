"""The bivariate closed form (k <= 2) against independent oracles: scipy, Owen's T function, densities."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.special import ndtr, owens_t
from scipy.stats import multivariate_normal, norm

from probust.mvn import mvn_cdf
from probust.mvn.bivariate import BVN_ERROR, bvn_cdf

F64 = torch.float64


def bvn_owen(h: float, k: float, r: float) -> float:
    """P(X <= h, Y <= k) for standard normals with correlation r, via Owen's T function."""
    if abs(r) == 1.0:
        return ndtr(min(h, k)) if r > 0 else max(0.0, ndtr(h) + ndtr(k) - 1.0)
    s = math.sqrt(1 - r * r)

    def t(x, a_num):
        if x == 0:
            return math.copysign(0.25, a_num) if a_num != 0 else 0.0
        return owens_t(x, a_num / (x * s))

    beta = 0.0 if (h * k > 0 or (h * k == 0 and h + k >= 0)) else 0.5
    return 0.5 * ndtr(h) + 0.5 * ndtr(k) - t(h, k - r * h) - t(k, h - r * k) - beta


def _hkr(n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Bounds h, k ~ N(0, 2^2) and correlations over both branches of the series (|r| < 0.925, >= 0.925)."""
    g = np.random.default_rng(seed)
    h, k = g.normal(0, 2.0, n), g.normal(0, 2.0, n)
    m = n // 4
    r = np.concatenate([g.uniform(-0.925, 0.925, n - 2 * m), g.uniform(0.925, 1.0, m), -g.uniform(0.925, 1.0, m)])
    return h, k, r


def test_bvn_cdf_matches_scipy_within_its_stated_error():
    h, k, r = _hkr(400, seed=1)
    h[:8] = [0.0, -8.0, 8.0, -5.0, 3.0, -1.0, 0.5, 0.0]  # far tails and the origin
    r[:8] = [0.0, 0.5, -0.5, 0.99, -0.99, 0.925, -0.925, 1 - 1e-9]
    p = bvn_cdf(torch.from_numpy(h), torch.from_numpy(k), torch.from_numpy(r))
    assert p.dtype == F64 and p.shape == (400,)
    expect = np.array(
        [
            multivariate_normal.cdf([a, b], cov=[[1.0, c], [c, 1.0]], abseps=1e-14, releps=0.0, maxpts=10_000_000)
            for a, b, c in zip(h, k, r)
        ]
    )
    np.testing.assert_allclose(p.numpy(), expect, rtol=0, atol=BVN_ERROR)


def test_bvn_cdf_gradient_is_the_density_formula():
    # dP/dh = phi(h) Phi((k - r h) / s), dP/dk likewise, dP/dr = the bivariate density (Plackett).
    h, k, r = _hkr(200, seed=2)
    r = np.clip(r, -0.99, 0.99)
    ht, kt, rt = (torch.from_numpy(a).requires_grad_(True) for a in (h, k, r))
    bvn_cdf(ht, kt, rt).sum().backward()
    s = np.sqrt((1 - r) * (1 + r))
    np.testing.assert_allclose(ht.grad.numpy(), norm.pdf(h) * norm.cdf((k - r * h) / s), rtol=1e-10, atol=1e-300)
    np.testing.assert_allclose(kt.grad.numpy(), norm.pdf(k) * norm.cdf((h - r * k) / s), rtol=1e-10, atol=1e-300)
    dens = np.array([multivariate_normal.pdf([a, b], cov=[[1.0, c], [c, 1.0]]) for a, b, c in zip(h, k, r)])
    np.testing.assert_allclose(rt.grad.numpy(), dens, rtol=1e-10, atol=1e-300)


def test_bvn_cdf_gradient_matches_finite_differences_of_its_value():
    h, k, r = _hkr(40, seed=3)
    args = tuple(torch.from_numpy(a).requires_grad_(True) for a in (h, np.clip(k, -3, 3), np.clip(r, -0.98, 0.98)))
    assert torch.autograd.gradcheck(bvn_cdf, args, eps=1e-6, atol=1e-8, rtol=1e-5)


@pytest.mark.parametrize("r", [1.0, -1.0])
def test_bvn_cdf_at_perfect_correlation_is_the_univariate_limit(r):
    h = torch.tensor([-1.0, 0.5, 2.0, 0.3, -2.0], dtype=F64)
    k = torch.tensor([0.5, -1.0, 1.0, 0.3, 1.5], dtype=F64)
    p = bvn_cdf(h, k, torch.full_like(h, r))
    # r = 1: X = Y, P = Phi(min(h, k)); r = -1: Y = -X, P = max(0, Phi(h) + Phi(k) - 1)
    expect = ndtr(np.minimum(h.numpy(), k.numpy())) if r > 0 else np.maximum(0.0, ndtr(h.numpy()) + ndtr(k.numpy()) - 1)
    np.testing.assert_allclose(p.numpy(), expect, rtol=0, atol=BVN_ERROR)


# ---- through mvn_cdf: k = 2 reaches the closed form -------------------------------------------


def test_k2_closed_form_matches_owens_t_and_scipy_to_1e10():
    g = np.random.default_rng(0)
    rhos = [0.0, 0.999999, -0.999999, 0.3, -0.3, 0.75, -0.75, 0.925, -0.925, 0.99, -0.99, 1 - 1e-12]
    h = g.normal(0, 2.5, 600)
    k = g.normal(0, 2.5, 600)
    r = np.concatenate([np.repeat(rhos, 25), g.uniform(-1, 1, 600 - 25 * len(rhos))])
    cov = np.stack([np.stack([np.ones_like(r), r], -1), np.stack([r, np.ones_like(r)], -1)], -2)
    z = np.stack([h, k], -1)
    p, err = mvn_cdf(torch.from_numpy(z), torch.from_numpy(cov), return_error=True)
    owen = np.array([bvn_owen(*args) for args in zip(h, k, r)])
    np.testing.assert_allclose(p.numpy(), owen, rtol=0, atol=1e-10)
    sp = np.array([multivariate_normal.cdf(zi, cov=ci) for zi, ci in zip(z[:200], cov[:200])])
    np.testing.assert_allclose(p.numpy()[:200], sp, rtol=0, atol=1e-10)
    assert (err <= 1e-12).all()


def test_k2_perfect_correlation_is_exact():
    h = torch.tensor([-1.0, 0.5, 2.0, 0.3], dtype=F64)
    k = torch.tensor([0.5, -1.0, 1.0, 0.3], dtype=F64)
    for r in (1.0, -1.0):
        cov = torch.tensor([[1.0, r], [r, 1.0]], dtype=F64)
        p = mvn_cdf(torch.stack([h, k], -1), cov)
        expect = [bvn_owen(a, b, r) for a, b in zip(h.tolist(), k.tolist())]
        np.testing.assert_allclose(p.numpy(), expect, atol=1e-14)
