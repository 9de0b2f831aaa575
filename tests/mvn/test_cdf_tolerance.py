"""mvn_cdf at its documented tolerance, against references whose own error is far below it.

Two exact oracles, each a low-dimensional integral whatever k is:

- one factor (tests/mvn/_one_factor.py): R_ij = lambda_i lambda_j (i != j), so
  P(X <= b) = integral phi(t) prod_i Phi((b_i - lambda_i t) / sqrt(1 - lambda_i^2)) dt (~1e-13);
- a factor plus a Gaussian Markov chain in a random order (tests/mvn/_factor_chain.py): full-rank
  correlations that are not one-factor (chain correlations decaying along a random order, signs
  mixed, neighbours up to ~0.95), by a chain recursion inside the factor integral (~1e-10).

The claims checked (mvn_cdf's docstring): the returned error is about a 99% bound on |error|, and a
point that stops on ``tol`` (returned error <= tol) is within tol with the same confidence. "Does
not exceed the stated confidence" is read with a binomial allowance over the points that can miss:
those whose value was sampled (QMC). Points settled by a closed form (k_eff <= 2) or by the
deterministic bounds carry a guaranteed error and may not miss at all; a point is told to be
sampled by its value moving with the seed. Over n sampled problems the number of misses of a 99%
bound is Binomial(n, 0.01), and the tests allow up to its 99.9% quantile. An error twice as large
would miss the bound about 12% of the time (3.5 standard errors over 8 replicates become 1.75:
P(|t_7| > 1.75) ~ 0.12); a study must hold enough sampled points for that to fail the check
(``can_see_a_doubled_error``: fewer than 1% of such studies would pass), and the doubled-error
tests inject it at every dimension and for both oracles.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from scipy.special import log_ndtr
from scipy.stats import binom, multivariate_normal

from probust.mvn import mvn_cdf
from tests.mvn._factor_chain import (
    batched_factor_chain_cdf,
    factor_chain_cdf,
    factor_chain_corr,
    factor_chain_params,
    factor_chain_problems,
    independent_cdf,
)
from tests.mvn._one_factor import one_factor_cdf, one_factor_corr, one_factor_problems

CONFIDENCE = 0.99  # mvn_cdf's docstring: the returned error is about a 99% bound
DOUBLED_MISS_RATE = 0.12  # P(|t_7| > 3.5 / 2): the miss rate of an error twice the estimate's
ROUNDING = 1e-14  # what a guaranteed error leaves out (mvn_cdf: "~0 (<= 1e-14)" for closed forms)
FAMILIES = {"one-factor": one_factor_problems, "factor-chain": factor_chain_problems}
# The oracles' own errors (each asserted below: quad's abserr; the factor-chain rules against twice
# their nodes), added to every comparison: 10^5 times below the tightest tol tested.
REF_ERROR = {"one-factor": 1e-11, "factor-chain": 1e-9}


@functools.cache
def problems(family: str, k: int, n: int, p_range: tuple[float, float], seed: int):
    """The exact problems of one study (bounds [n, k], correlations [n, k, k], exact p [n]),
    generated once per session: several tests read the same study."""
    return FAMILIES[family](k, n, p_range, seed)


def run_mvn(b: np.ndarray, corr: np.ndarray, tol: float, *, per_seed: int = 10, seed: int = 0, **kwargs):
    """mvn_cdf over the problems, a different seed for each group of ``per_seed`` of them."""
    ps, es = [], []
    for s in range(0, len(b), per_seed):
        p, e = mvn_cdf(
            torch.from_numpy(b[s : s + per_seed]),
            torch.from_numpy(corr[s : s + per_seed]),
            tol=tol,
            seed=seed + s,
            return_error=True,
            **kwargs,
        )
        ps.append(p.numpy())
        es.append(e.numpy())
    return np.concatenate(ps), np.concatenate(es)


def run_study(b: np.ndarray, corr: np.ndarray, tol: float, **kwargs):
    """(p, err, sampled): mvn_cdf's values and errors, and which points were sampled: their value
    moves with the seed, while closed forms and bound-settled points do not (that choice depends
    on the bounds and tol alone, so a short run with another seed tells it cheaply)."""
    p, err = run_mvn(b, corr, tol, **kwargs)
    other, _ = run_mvn(b, corr, tol, seed=10_000, max_samples=1024)
    return p, err, other != p


def allowed_misses(n: int) -> int:
    """Misses of a CONFIDENCE bound over n independent problems: the 99.9% quantile of their count."""
    return int(binom.ppf(0.999, n, 1.0 - CONFIDENCE))


def can_see_a_doubled_error(n: int) -> bool:
    """Whether a study of n sampled points fails an error twice the estimate's with 99% chance."""
    return bool(binom.cdf(allowed_misses(n), n, DOUBLED_MISS_RATE) < 0.01)


def check_claims(
    p: np.ndarray, err: np.ndarray, ref: np.ndarray, tol: float, sampled: np.ndarray, ref_error: float
) -> str:
    """Assert the documented claims on [n] values, errors, exact values and sampled flags (the
    reference known to ``ref_error``); return what was measured (the slow study prints it)."""
    diff = np.maximum(np.abs(p - ref) - ref_error, 0.0)  # the least |error| the reference allows
    n, n_sampled = len(diff), int(sampled.sum())
    beyond = diff > err
    stopped = err <= tol  # stopped on tol, not on max_samples
    beyond_tol = diff > tol
    shares = {
        "within error estimate": 1.0 - beyond.mean(),
        "within tol": 1.0 - beyond_tol.mean(),
        "stopped on tol": float(np.mean(stopped)),
        "within tol where stopped on tol": 1.0 - beyond_tol[stopped].sum() / max(int(stopped.sum()), 1),
        "sampled": n_sampled / n,
    }
    q = " ".join(f"{v:.1e}" for v in np.quantile(diff, [0.5, 0.9, 0.99, 1.0]))
    where = f"n={n}, tol={tol:.0e}, p in [{ref.min():.3f}, {ref.max():.3f}], |error| quantiles 50/90/99/100% {q}"
    settled_beyond = int((diff[~sampled] > err[~sampled] + ROUNDING).sum())
    assert settled_beyond == 0, f"{settled_beyond} points with a guaranteed error beyond it; {where}"
    misses = int(beyond[sampled].sum())
    assert misses <= allowed_misses(n_sampled), f"{misses} of {n_sampled} sampled beyond the error estimate; {where}"
    misses_tol = int((beyond_tol & stopped & sampled).sum())
    allowed = allowed_misses(int((stopped & sampled).sum()))
    assert misses_tol <= allowed, f"{misses_tol} stopped on tol beyond it; {where}"
    return ", ".join(f"{name} {share:.1%}" for name, share in shares.items()) + "; " + where


def doubled(p: np.ndarray, ref: np.ndarray, sampled: np.ndarray) -> np.ndarray:
    """The values of an integrator whose sampling error is twice mvn_cdf's, with the same error
    estimate (closed forms and bound-settled values unchanged)."""
    return np.where(sampled, ref + 2.0 * (p - ref), p)


# --------------------------------------------------------------------------------------------
# the oracle itself


def test_one_factor_oracle_matches_closed_forms_and_scipy():
    # Equicorrelation 1/2 at the origin: P(X <= 0) = 1 / (k + 1) (exchangeability of k + 1 normals).
    for k in (3, 9, 30, 99):
        assert abs(one_factor_cdf(np.zeros(k), np.full(k, math.sqrt(0.5))) - 1.0 / (k + 1)) < 1e-12
    # Independence: a product of ndtr; and a general 4-dim problem against scipy at tight settings.
    b = np.array([0.3, -0.4, 1.2, 0.8])
    assert abs(one_factor_cdf(b, np.zeros(4)) - float(np.exp(log_ndtr(b).sum()))) < 1e-13
    lam = np.array([0.9, -0.5, 0.3, 0.7])
    expect = multivariate_normal.cdf(b, cov=one_factor_corr(lam), abseps=1e-8, releps=0.0, maxpts=2_000_000)
    assert abs(one_factor_cdf(b, lam) - expect) < 5e-8


def test_factor_chain_oracle_matches_closed_forms_scipy_and_itself():
    rng = np.random.default_rng(5)
    # The correlation is that of the construction: X = A (T, E_1..E_k), built step by step.
    k = 6
    lam, rho, order = (v[0] for v in factor_chain_params(k, 1, seed=3))
    chain = np.zeros((k, k))  # M (chain positions) = chain @ E
    chain[0, 0] = 1.0
    for j in range(1, k):
        chain[j] = rho[j - 1] * chain[j - 1]
        chain[j, j] = math.sqrt(1 - rho[j - 1] ** 2)
    a = np.hstack([lam[:, None], np.sqrt(1 - lam**2)[:, None] * chain[order]])
    np.testing.assert_allclose(factor_chain_corr(lam, rho, order), a @ a.T, atol=1e-14)
    # No factor, no chain: a product of ndtr; no chain: the one-factor quadrature.
    for k in (3, 9, 30):
        b = rng.normal(1.5, 1.0, k)
        lam, rho, order = (v[0] for v in factor_chain_params(k, 1, seed=k))
        assert abs(factor_chain_cdf(b, 0 * lam, 0 * rho, order) - independent_cdf(b)) < 1e-13
        assert abs(factor_chain_cdf(b, lam, 0 * rho, order) - one_factor_cdf(b, lam)) < 1e-12
    # A two-step chain is a bivariate normal (scipy's 2-D cdf is Genz's closed-form algorithm).
    b2 = np.array([0.4, -0.3])
    bvn = multivariate_normal.cdf(b2, cov=[[1.0, -0.8], [-0.8, 1.0]])
    assert abs(factor_chain_cdf(b2, np.zeros(2), np.array([-0.8]), np.array([1, 0])) - bvn) < 1e-13
    # Factor and chain together, against scipy's lattice rules at a tight setting.
    b4 = np.array([0.3, 1.1, -0.2, 0.8])
    lam, rho, order = (v[0] for v in factor_chain_params(4, 1, seed=11))
    expect = multivariate_normal.cdf(
        b4, cov=factor_chain_corr(lam, rho, order), abseps=1e-8, releps=0.0, maxpts=4_000_000, rng=0
    )
    assert abs(factor_chain_cdf(b4, lam, rho, order) - expect) < 5e-8
    # Twice the nodes of both rules: the default's own error is ~1e-10 at k = 99, far below any tol.
    for k in (9, 99):
        b, _, _ = problems("factor-chain", k, 1, (0.3, 0.7), 77)
        lam, rho, order = factor_chain_params(k, 1, seed=77)
        coarse = batched_factor_chain_cdf(b, lam, rho, order)
        fine = batched_factor_chain_cdf(b, lam, rho, order, nodes=128, hermite=128)
        assert abs(coarse - fine).max() < 1e-9, (k, coarse, fine)


# --------------------------------------------------------------------------------------------
# the claims, over enough independent problems to see a miss rate of the stated size (fast)

STUDIES = [  # (k, tol, n): p in [0.05, 0.99]
    (3, 1e-4, 200),
    (3, 1e-5, 200),
    (9, 1e-4, 200),
    (9, 1e-5, 120),
]


@functools.cache
def study(family: str, k: int, tol: float, n: int, p_range: tuple[float, float] = (0.05, 0.99), pool: int = 0):
    """(p, err, sampled, exact p) of one study on the first n of ``pool`` (or n) problems of the
    family and dimension (a pool shared by studies at several tols), computed once per session."""
    b, corr, ref = problems(family, k, max(n, pool), p_range, 100 * k + int(p_range[0] * 100) + len(family))
    return (*run_study(b[:n], corr[:n], tol), ref[:n])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k, tol, n", STUDIES)
def test_error_is_within_the_estimate_and_within_tol_where_stopped_on_tol(family, k, tol, n):
    p, err, sampled, ref = study(family, k, tol, n, pool=200)
    assert can_see_a_doubled_error(int(sampled.sum())), f"only {int(sampled.sum())} of {n} points sampled"
    check_claims(p, err, ref, tol, sampled, REF_ERROR[family])


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("k, tol, n", STUDIES)
def test_a_doubled_error_fails_the_coverage_check(family, k, tol, n):
    # The margin the checks leave is smaller than a factor 2 regression in the error.
    p, err, sampled, ref = study(family, k, tol, n, pool=200)
    with pytest.raises(AssertionError, match="beyond the error estimate"):
        check_claims(doubled(p, ref, sampled), err, ref, tol, sampled, REF_ERROR[family])


@pytest.mark.parametrize(
    "family, k, n, p_range",
    [
        ("one-factor", 30, 20, (0.05, 0.99)),
        ("factor-chain", 30, 10, (0.05, 0.99)),
        ("one-factor", 60, 4, (0.05, 0.9)),
        ("one-factor", 99, 3, (0.05, 0.9)),
        ("one-factor", 99, 3, (0.9, 0.999)),
        ("factor-chain", 99, 2, (0.9, 0.999)),
    ],
)
def test_high_dimensional_values_are_within_their_error_estimate(family, k, n, p_range):
    # Too few problems to measure a 1% miss rate (the slow study below does): agreement only.
    p, err, sampled, ref = study(family, k, 1e-4, n, p_range)
    check_claims(p, err, ref, 1e-4, sampled, REF_ERROR[family])


def test_a_point_stopped_by_max_samples_reports_an_error_above_tol_that_still_covers():
    # k = 99, p in the middle: 200,000 samples are often not enough for tol = 1e-4 (docs/mvn.md).
    b, corr, ref = one_factor_problems(99, 2, (0.3, 0.6), seed=4242)
    p, err = run_mvn(b, corr, 1e-4, max_samples=20_000)
    assert (err > 1e-4).all()
    assert (np.abs(p - ref) <= err).all()


# --------------------------------------------------------------------------------------------
# the coverage study at high dimension (minutes: `pytest -m slow`)


@pytest.mark.slow
@pytest.mark.parametrize(
    "family, k, tol, n",
    [
        pytest.param("one-factor", 30, 1e-4, 150, marks=pytest.mark.slow(seconds=7)),
        pytest.param("one-factor", 30, 1e-5, 60, marks=pytest.mark.slow(seconds=6)),
        pytest.param("one-factor", 60, 1e-4, 120, marks=pytest.mark.slow(seconds=26)),
        pytest.param("one-factor", 60, 1e-5, 30, marks=pytest.mark.slow(seconds=8)),
        pytest.param("one-factor", 99, 1e-4, 120, marks=pytest.mark.slow(seconds=67)),
        pytest.param("one-factor", 99, 1e-5, 20, marks=pytest.mark.slow(seconds=13)),
        pytest.param("factor-chain", 30, 1e-4, 150, marks=pytest.mark.slow(seconds=11)),
        pytest.param("factor-chain", 60, 1e-4, 120, marks=pytest.mark.slow(seconds=38)),
        pytest.param("factor-chain", 99, 1e-4, 120, marks=pytest.mark.slow(seconds=86)),
    ],
)
def test_coverage_study_at_high_dimension_and_mid_range_probabilities(family, k, tol, n):
    # Every row checks the claims. The tol 1e-4 rows hold enough sampled points to see a doubled
    # error (asserted: 120 or more), and the injected doubled error must fail them; the tol 1e-5
    # rows measure the cap (docs/mvn.md's table) on fewer points.
    b, corr, ref = problems(family, k, n, (0.05, 0.9), 7 * k + n)
    p, err, sampled = run_study(b, corr, tol)
    measured = check_claims(p, err, ref, tol, sampled, REF_ERROR[family])
    twice = int((np.abs(doubled(p, ref, sampled) - ref)[sampled] > err[sampled]).sum())
    print(f"{family} k={k}: {measured}; a doubled error misses {twice} of {int(sampled.sum())}")
    if tol == 1e-4:
        assert can_see_a_doubled_error(int(sampled.sum()))
        with pytest.raises(AssertionError, match="beyond the error estimate"):
            check_claims(doubled(p, ref, sampled), err, ref, tol, sampled, REF_ERROR[family])
