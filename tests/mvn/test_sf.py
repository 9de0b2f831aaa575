"""mvn_sf, the failure probability with relative accuracy, against independent oracles.

Oracles: closed forms (k = 1, in log space beyond float64's normal range; orthogonal boundaries,
1 - prod Phi(z_i) computed with log1p/expm1, up to k = 999), one-dimensional integrals by scipy's
adaptive quadrature at relative tolerance 1e-11 or better (bivariate; equicorrelated k = 6; any
one-factor correlation R_ij = lambda_i lambda_j, up to k = 999, where the failure probability given
the factor is again 1 - prod Phi without cancellation), and mvn_cdf where both are accurate.

The relative error bound ("about 99%" per QMC term, summed over the terms) is checked like
mvn_cdf's error (tests/mvn/test_cdf_tolerance.py): over 200 one-factor problems at most the 99.9%
quantile of Binomial(n, 0.01) misses, and an error twice as large is seen.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, special, stats

from probust.mvn import mvn_cdf, mvn_sf

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


def _one_factor_fail(z: np.ndarray, lam: np.ndarray) -> float:
    """Y_i = lambda_i W + sqrt(1 - lambda_i^2) E_i: P(some Y_i > z_i) = E_W[1 - prod_i Phi(.)], the
    inner complement without cancellation and the outer integral by quadrature (relative 1e-11)."""
    s = np.sqrt(1.0 - lam**2)

    def given(w: float) -> float:
        tails = special.ndtr(-(z - lam * w) / s)
        return math.exp(-0.5 * w * w) / math.sqrt(2 * math.pi) * _orthogonal_fail_from_tails(tails)

    return integrate.quad(given, -np.inf, np.inf, epsabs=0, epsrel=1e-11, limit=500)[0]


def _one_factor_corr(lam: np.ndarray) -> np.ndarray:
    return np.outer(lam, lam) + np.diag(1.0 - lam**2)


def _one_factor_sf_problems(k: int, n: int, seed: int, near: int | None = None):
    """n problems of dimension k: loadings |lambda| in [0.1, 0.9] (a fifth negative), bounds
    z = level + Exp(0.7) spread with level uniform in [3, 7] (failure probabilities ~1e-12 to
    1e-2); with ``near``, only that many bounds are near the level and the rest beyond 10 (the
    shape of a many-class point: most boundaries far). Returns z [n, k], corr [n, k, k], exact [n]."""
    rng = np.random.default_rng(seed)
    zs, corrs, refs = [], [], []
    for _ in range(n):
        lam = rng.uniform(0.1, 0.9, k) * np.where(rng.random(k) < 0.2, -1.0, 1.0)
        z = rng.uniform(3.0, 7.0) + rng.exponential(0.7, k)
        if near is not None:
            z[near:] = 10.0 + rng.exponential(1.0, k - near)
            rng.shuffle(z)
        zs.append(z)
        corrs.append(_one_factor_corr(lam))
        refs.append(_one_factor_fail(z, lam))
    return np.array(zs), np.array(corrs), np.array(refs)


@pytest.mark.parametrize("z", [0.5, 3.0, 5.0, 6.0, 7.0])
def test_sf_k1_is_the_normal_tail_to_relative_precision(z):
    # variance 4, bound 2 z: z standard deviations
    p, rel = mvn_sf(torch.tensor([2.0 * z], dtype=F64), torch.eye(1, dtype=F64) * 4.0, return_error=True)
    expected = special.ndtr(-z)
    assert abs(p.item() / expected - 1) < 1e-10
    assert rel.item() < 1e-10


@pytest.mark.parametrize(
    "z1, z2, r",
    [
        (1.0, 2.0, 0.3),
        (3.0, 4.0, 0.5),
        (7.0, 7.0, 0.9),
        (7.0, 7.2, -0.9),
        (6.5, 7.0, 0.0),
        (7.0, 8.0, 0.99),
        (7.0, 7.0, 0.999),
    ],
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


@pytest.mark.parametrize(
    "rho, z", [(0.5, [6.5, 6.7, 6.9, 7.0, 7.2, 7.4]), (0.3, [2, 2.5, 3, 3, 3.5, 4]), (0.9, [7.0] * 6)]
)
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
    p, err = mvn_cdf(upper, cov, tol=1e-5, return_error=True)
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


def test_one_factor_oracle_matches_the_equicorrelated_and_orthogonal_forms():
    z = np.array([6.5, 6.7, 6.9, 7.0, 7.2, 7.4])
    assert abs(_one_factor_fail(z, np.full(6, math.sqrt(0.5))) / _equicorrelated_fail(z, 0.5) - 1) < 1e-10
    assert abs(_one_factor_fail(z, np.zeros(6)) / _orthogonal_fail(z) - 1) < 1e-10


@pytest.mark.parametrize("k, n, near", [(9, 4, None), (30, 3, None), (99, 2, None), (999, 2, 6)])
def test_sf_one_factor_matches_the_integral_beyond_k6(k, n, near):
    z, corr, exact = _one_factor_sf_problems(k, n, seed=k, near=near)
    p, rel = mvn_sf(torch.from_numpy(z), torch.from_numpy(corr), rtol=1e-2, return_error=True)
    actual = np.abs(p.numpy() / exact - 1)
    assert (actual <= rel.numpy()).all(), (actual, rel)
    assert (rel.numpy() < 1e-2).all()


@pytest.mark.parametrize("k", [99, 999])
def test_sf_orthogonal_boundaries_equal_one_minus_the_product_at_many_classes(k):
    # Most boundaries far, a few near (a many-class point): each term within reach is a QMC
    # integral of up to k dimensions, so hundreds of near ones would take minutes.
    rng = np.random.default_rng(k)
    z = 10.0 + rng.exponential(1.0, (2, k))
    z[0, :4] = [6.0, 6.2, 6.5, 7.0]
    z[1, -8:] = 5.0 + rng.exponential(1.0, 8)
    p, rel = mvn_sf(torch.from_numpy(z), torch.eye(k, dtype=F64), return_error=True)
    expected = np.array([_orthogonal_fail(row) for row in z])
    assert (np.abs(p.numpy() / expected - 1) <= rel.numpy()).all(), (p, expected, rel)
    assert (rel.numpy() < 1e-2).all()


def _sf_misses(p: np.ndarray, rel: np.ndarray, exact: np.ndarray) -> int:
    """Points whose actual relative error exceeds the returned bound."""
    return int((np.abs(p / exact - 1) > rel).sum())


@pytest.fixture(scope="module")
def sf_study():
    """200 one-factor problems at k = 9 (each with QMC terms), mvn_sf's values, bounds, exact values."""
    z, corr, exact = _one_factor_sf_problems(9, 200, seed=2024)
    p, rel = mvn_sf(torch.from_numpy(z), torch.from_numpy(corr), rtol=1e-2, return_error=True)
    return p.numpy(), rel.numpy(), exact


def test_sf_relative_error_bound_covers_at_least_99_percent(sf_study):
    p, rel, exact = sf_study
    allowed = int(stats.binom.ppf(0.999, len(p), 0.01))
    assert _sf_misses(p, rel, exact) <= allowed
    assert (rel < 1e-2).all()


def test_a_doubled_sf_error_fails_the_coverage_check(sf_study):
    # The check can see an error twice the bound's size: the bound is not so loose that it hides it.
    p, rel, exact = sf_study
    allowed = int(stats.binom.ppf(0.999, len(p), 0.01))
    assert _sf_misses(exact * (1 + 2 * (p / exact - 1)), rel, exact) > allowed


@pytest.mark.slow
def test_sf_relative_error_bound_covers_at_k30():
    z, corr, exact = _one_factor_sf_problems(30, 150, seed=30)
    p, rel = mvn_sf(torch.from_numpy(z), torch.from_numpy(corr), rtol=1e-2, return_error=True)
    assert _sf_misses(p.numpy(), rel.numpy(), exact) <= int(stats.binom.ppf(0.999, 150, 0.01))


@pytest.mark.parametrize("k", [1, 3])
def test_sf_beyond_z_37_reports_the_precision_float64_keeps(k):
    # Phi(-z) leaves float64's normal range near z = 37.5 (subnormal numbers: a fixed absolute
    # step of 2^-1074) and underflows to 0 near z = 38.5. Independent boundaries; the exact value
    # sum_i Phi(-z_i) prod_{j < i} Phi(z_j) (disjoint events, no cancellation) in 50-digit
    # arithmetic (mpmath), whose exponent range nothing here leaves.
    mpmath = pytest.importorskip("mpmath")
    mpmath.mp.dps = 50
    zs = np.arange(36.0, 40.01, 0.1)
    upper = np.stack([z + np.arange(k) * 0.3 for z in zs])
    p, rel = mvn_sf(torch.from_numpy(upper), torch.eye(k, dtype=F64), return_error=True)
    p, rel = p.numpy(), rel.numpy()
    assert np.isfinite(rel).all() and (rel <= 1).all()
    for row, value, bound in zip(upper, p, rel):
        tails = [mpmath.ncdf(-mpmath.mpf(float(zi))) for zi in row]
        exact = mpmath.fsum(t * mpmath.fprod([1 - u for u in tails[:i]]) for i, t in enumerate(tails))
        actual = float(abs(mpmath.mpf(float(value)) / exact - 1))
        assert actual <= bound, (row[0], value, float(exact), actual, bound)
    assert (p[zs < 37.5] > 0).all() and (p[zs > 38.6] == 0).all() and (rel[p == 0] == 1).all()
