"""The one-factor oracle of the mvn tests: exact orthant probabilities at any dimension.

For a one-factor correlation R_ij = lambda_i lambda_j (i != j), R_ii = 1, |lambda_i| < 1,
X_i = lambda_i T + sqrt(1 - lambda_i^2) E_i with T, E_i independent N(0, 1), so P(X <= b) is the
one-dimensional integral of phi(t) prod_i Phi((b_i - lambda_i t) / sqrt(1 - lambda_i^2)), which
scipy.integrate.quad computes to ~1e-13 whatever k is.
"""

from __future__ import annotations

import math

import numpy as np
from scipy import integrate, optimize
from scipy.special import log_ndtr, roots_hermitenorm

_GH_T, _GH_W = roots_hermitenorm(96)
_GH_W = _GH_W / math.sqrt(2 * math.pi)


def one_factor_cdf(b: np.ndarray, lam: np.ndarray) -> float:
    """P(X <= b) for the one-factor correlation of ``lam``, by adaptive quadrature (~1e-13)."""
    s = np.sqrt(1.0 - lam**2)

    def integrand(t: float) -> float:
        return math.exp(-0.5 * t * t - 0.5 * math.log(2 * math.pi) + float(log_ndtr((b - lam * t) / s).sum()))

    value, abserr = integrate.quad(integrand, -12.0, 12.0, epsabs=1e-13, epsrel=1e-12, limit=500)
    assert abserr < 1e-11, abserr  # the reference's own error, far below any tol tested
    return value


def _approx_cdf(b: np.ndarray, lam: np.ndarray) -> float:
    """The same integral by 96-point Gauss-Hermite: only to place bounds at a wanted probability."""
    s = np.sqrt(1.0 - lam**2)
    return float(_GH_W @ np.exp(log_ndtr((b[None] - lam[None] * _GH_T[:, None]) / s).sum(1)))


def _offset_gap(c: float, spread: np.ndarray, lam: np.ndarray, target: float) -> float:
    return _approx_cdf(c + spread, lam) - target


def one_factor_corr(lam: np.ndarray) -> np.ndarray:
    r = np.outer(lam, lam)
    np.fill_diagonal(r, 1.0)
    return r


def one_factor_problems(k: int, n: int, p_range: tuple[float, float], seed: int):
    """n problems of dimension k: loadings |lambda| in [0.2, 0.95] (a fifth negative, so some
    correlations are negative), bounds c + Exp(1) spread with c placing the probability near a
    target drawn uniformly from p_range. Returns bounds [n, k], correlations [n, k, k], exact p [n]."""
    rng = np.random.default_rng(seed)
    bs, corrs, refs = [], [], []
    for _ in range(n):
        lam = rng.uniform(0.2, 0.95, k) * np.where(rng.random(k) < 0.2, -1.0, 1.0)
        spread = rng.exponential(1.0, k)
        target = rng.uniform(*p_range)
        c = optimize.brentq(_offset_gap, -12.0, 15.0, args=(spread, lam, target), xtol=1e-3)
        bs.append(c + spread)
        corrs.append(one_factor_corr(lam))
        refs.append(one_factor_cdf(c + spread, lam))
    return np.array(bs), np.array(corrs), np.array(refs)
