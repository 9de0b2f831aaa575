"""The dropped tails' bias: mvn_cdf's estimate is centred in what the dropped coordinates may cost.

Where >= 3 coordinates are constrained, ``mvn_cdf`` drops those whose tail P(X_j > upper_j) is
below a share of ``tol`` (their sum, ``bias``, is at most 5% of it): the kept event A alone has
P(A) >= P(A and not B) = truth >= P(A) - bias, so the code takes the middle, P(A) - bias / 2
(docs/mvn.md; ``mvn/cdf.py``), and adds ``bias`` to the error. Subtracting the whole bias, or
none, stays within the reported error: only a measurement finer than ``cdf_error`` sees it.

The problems: the kept coordinates have P(A) = 1/2 exactly (solved by quadrature), and the
dropped ones are independent of them and of each other, so the truth is exactly
(1/2) prod_j (1 - t_j), which is the centre P(A) - bias / 2 up to O(bias^2). Over many problems
(random correlations and variances, one to three kept coordinates, two to twenty dropped), the
mean signed error must be a small fraction of the mean bias; subtracting the whole bias moves it
to -bias / 2. Where QMC runs (three equicorrelated coordinates) its error is noise around 0: each
problem gets its own randomisation (``seed``; one seed for all would make their errors move
together), and the average over 96 of them is ten times finer than bias / 2.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy import integrate, optimize, special, stats

from probust.mvn import mvn_cdf
from probust.mvn.bivariate import BVN_ERROR

TOL = 0.01  # large, so that the dropped tails (up to 5% of it) are large against rounding
DROP_SHARE = 0.05  # mvn/cdf.py: the share of tol the dropped coordinates may cost
_NODES, _WEIGHTS = np.polynomial.hermite_e.hermegauss(200)  # for E[f(W)], W ~ N(0, 1)
_WEIGHTS = _WEIGHTS / _WEIGHTS.sum()


def _bivariate(h: float, k: float, rho: float) -> float:
    """P(X_1 <= h, X_2 <= k) at correlation rho, h, k != 0, by Owen's T function (scipy)."""
    s = math.sqrt(1 - rho * rho)
    beta = 0.0 if h * k > 0 else 0.5
    return float(
        0.5 * special.ndtr(h)
        + 0.5 * special.ndtr(k)
        - special.owens_t(h, (k - rho * h) / (h * s))
        - special.owens_t(k, (h - rho * k) / (k * s))
        - beta
    )


def _equicorrelated(z: float, k: int, rho: float) -> float:
    """P(X_i <= z for all i <= k), every pair correlated rho >= 0: X_i = sqrt(rho) W + sqrt(1 - rho) E_i,
    by Gauss-Hermite quadrature over W (200 nodes: a smooth integrand, exact to rounding)."""
    inner = special.ndtr((z - math.sqrt(rho) * _NODES) / math.sqrt(1 - rho))
    return float((_WEIGHTS * inner**k).sum())


def test_the_oracles_agree_with_quadrature():
    for h, k, rho in ((0.4, 1.2, -0.6), (1.5, -0.3, 0.7), (-0.8, -0.2, 0.1)):
        s = math.sqrt(1 - rho * rho)
        value, _ = integrate.quad(
            lambda t, k=k, rho=rho, s=s: stats.norm.pdf(t) * special.ndtr((k - rho * t) / s), -40, h, epsabs=1e-15
        )
        assert math.isclose(_bivariate(h, k, rho), value, rel_tol=0, abs_tol=1e-13)
    for z, rho in ((0.9, 0.3), (0.2, 0.55)):
        value, _ = integrate.quad(
            lambda w, z=z, rho=rho: (
                stats.norm.pdf(w) * special.ndtr((z - math.sqrt(rho) * w) / math.sqrt(1 - rho)) ** 3
            ),
            -40,
            40,
            epsabs=1e-15,
            points=[0.0],
        )
        assert math.isclose(_equicorrelated(z, 3, rho), value, rel_tol=0, abs_tol=1e-13)


def _kept_at_one_half(kept: int, gen: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """(z, correlation) of kept coordinates with P(all X_i <= z_i) = 1/2 exactly."""
    if kept == 1:
        return np.zeros(1), np.eye(1)
    rho = gen.uniform(-0.8, 0.8) if kept == 2 else gen.uniform(0.1, 0.6)
    if kept == 2:
        h = gen.uniform(0.2, 1.5)
        k = optimize.brentq(lambda k: _bivariate(h, k, rho) - 0.5, 1e-3, 10, xtol=1e-15)
        return np.array([h, k]), np.array([[1.0, rho], [rho, 1.0]])
    z = optimize.brentq(lambda z: _equicorrelated(z, kept, rho) - 0.5, -5, 10, xtol=1e-15)
    return np.full(kept, z), np.full((kept, kept), rho) + (1 - rho) * np.eye(kept)


def _problem(kept: int, gen: np.random.Generator, width: int) -> tuple[np.ndarray, np.ndarray, float, float]:
    """(upper [width], cov [width, width], truth, bias): padded with unconstrained coordinates."""
    z, corr = _kept_at_one_half(kept, gen)
    dropped = int(gen.integers(max(2, 3 - kept), 21))
    eps = TOL * DROP_SHARE / (kept + dropped)  # a tail below it is dropped
    tails = gen.uniform(0.2, 0.95, dropped) * eps
    used = kept + dropped
    scale = gen.uniform(0.5, 2.0, used)  # any variances: the CDF standardises
    upper = np.full(width, np.inf)
    upper[:used] = np.concatenate([z, stats.norm.isf(tails)]) * scale
    cov = np.eye(width)
    block = np.eye(used)
    block[:kept, :kept] = corr
    cov[:used, :used] = block * np.outer(scale, scale)
    return upper, cov, 0.5 * float(np.prod(1 - tails)), float(tails.sum())


def test_the_closed_forms_estimate_is_centred_in_what_the_dropped_tails_may_cost():
    # One and two kept coordinates (the closed forms): no noise, the centre to rounding.
    gen = np.random.default_rng(0)
    problems = [_problem(1 + i % 2, gen, 22) for i in range(200)]
    upper, cov = (torch.from_numpy(np.stack([q[j] for q in problems])) for j in (0, 1))
    truth, bias = (np.array([q[j] for q in problems]) for j in (2, 3))
    p, err = mvn_cdf(upper, cov, tol=TOL, return_error=True)
    error = p.numpy() - truth
    assert (err.numpy() >= bias * (1 - 1e-9)).all() and (np.abs(error) <= err.numpy()).all()  # it holds the bias
    # subtracting the whole bias: -0.5 x the mean bias; none: +0.5 x
    assert abs(error.mean()) < 0.02 * bias.mean(), (error.mean(), bias.mean())
    assert np.abs(error).max() < 0.02 * bias.max()


def test_the_sampled_estimate_is_centred_in_what_the_dropped_tails_may_cost_on_average():
    # Three equicorrelated kept coordinates (QMC), one problem per randomisation.
    gen = np.random.default_rng(1)
    errors, biases, errs = [], [], []
    for seed in range(96):
        upper, cov, truth, bias = _problem(3, gen, 23)
        p, err = mvn_cdf(torch.from_numpy(upper), torch.from_numpy(cov), tol=TOL, return_error=True, seed=seed)
        errors.append(float(p) - truth)
        biases.append(bias)
        errs.append(float(err))
    error, bias = np.array(errors), np.array(biases)
    assert (np.abs(error) <= np.array(errs)).mean() >= 0.95  # within the reported (99%) error
    spread = error.std() / math.sqrt(len(error))
    assert 5 * spread < 0.5 * bias.mean(), (spread, bias.mean())  # the average can see -bias / 2
    assert abs(error.mean()) < 4 * spread, (error.mean(), spread, bias.mean())


def test_a_coordinate_is_dropped_only_where_the_dropped_tails_cost_at_most_five_percent_of_tol():
    # Two kept coordinates and four more, each with the tail c tol / 6 (6 constrained): the four
    # are dropped exactly where their share c is below 5%, and then the problem is the closed
    # form's, whose error is its rounding bound (BVN_ERROR, 1e-14) plus the dropped tails, at most
    # 5% of tol. Kept, they make the problem sampled, with an error of another size.
    gen = np.random.default_rng(2)
    for c in (0.02, 0.04, 0.049, 0.051, 0.06, 0.08, 0.12):
        z, corr = _kept_at_one_half(2, gen)
        tail = c * TOL / 6
        upper = torch.from_numpy(np.concatenate([z, np.full(4, stats.norm.isf(tail))]))
        cov = torch.eye(6, dtype=torch.float64)
        cov[:2, :2] = torch.from_numpy(corr)
        _, err = mvn_cdf(upper, cov, tol=TOL, return_error=True)
        closed_form = math.isclose(float(err), BVN_ERROR + 4 * tail, rel_tol=1e-9)
        assert closed_form == (c < DROP_SHARE), (c, float(err), 4 * tail)
        if closed_form:
            assert float(err) <= DROP_SHARE * TOL + BVN_ERROR
