"""Binomial intervals (estimators.monte_carlo.binomial_interval, estimators.trust.upper_rate) against scipy and closed forms.

Oracles: ``scipy.stats.beta.ppf`` (the Clopper-Pearson bounds' definition), the Wilson score
interval's closed form in plain Python floats, the closed forms of the k = 0 and k = n edges
(1 - (alpha/2)^(1/n) and (alpha/2)^(1/n)), and ``scipy.stats.binom.cdf`` for the defining
equation of the one-sided bound and for exact coverage.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import torch
from scipy import stats

from probust.estimators.monte_carlo import INTERVALS, binomial_interval
from probust.estimators.trust import upper_rate

CONFIDENCES = (0.9, 0.95, 0.999)


def _counts() -> tuple[torch.Tensor, torch.Tensor]:
    pairs = [(k, n) for n in (1, 2, 7, 50, 1000, 10_000) for k in sorted({0, 1, n // 3, n // 2, n - 1, n})]
    k, n = zip(*pairs)
    return torch.tensor(k), torch.tensor(n)


@pytest.mark.parametrize("confidence", CONFIDENCES)
def test_clopper_pearson_is_the_beta_quantiles_exactly(confidence):
    k, n = _counts()
    low, high = binomial_interval(k, n, confidence, "clopper-pearson")
    assert low.dtype == high.dtype == torch.float64
    alpha = 1 - confidence
    for i, (ki, ni) in enumerate(zip(k.tolist(), n.tolist())):
        want_low = 0.0 if ki == 0 else stats.beta.ppf(alpha / 2, ki, ni - ki + 1)
        want_high = 1.0 if ki == ni else stats.beta.ppf(1 - alpha / 2, ki + 1, ni - ki)
        assert low[i].item() == want_low and high[i].item() == want_high, (ki, ni)


@pytest.mark.parametrize("confidence", CONFIDENCES)
def test_clopper_pearson_edges_have_closed_forms(confidence):
    alpha = 1 - confidence
    n = torch.tensor([1, 5, 100, 4000])
    low, high = binomial_interval(torch.zeros_like(n), n, confidence, "clopper-pearson")
    assert (low == 0).all()
    expected = [1 - (alpha / 2) ** (1 / m) for m in n.tolist()]
    np.testing.assert_allclose(high.numpy(), expected, rtol=1e-12)
    low, high = binomial_interval(n, n, confidence, "clopper-pearson")
    assert (high == 1).all()
    np.testing.assert_allclose(low.numpy(), [(alpha / 2) ** (1 / m) for m in n.tolist()], rtol=1e-12)


@pytest.mark.parametrize("n", [10, 40])
def test_clopper_pearson_covers_at_least_the_nominal_level_at_every_p(n):
    # Exact coverage over the binomial: sum of P(K = k) over the k whose interval holds p.
    k = torch.arange(n + 1)
    low, high = binomial_interval(k, torch.full_like(k, n), 0.95, "clopper-pearson")
    for p in np.linspace(0.001, 0.999, 199):
        covered = (low.numpy() <= p) & (p <= high.numpy())
        assert stats.binom.pmf(np.arange(n + 1), n, p)[covered].sum() >= 0.95 - 1e-12, p


def _wilson(k: int, n: int, confidence: float) -> tuple[float, float]:
    z = stats.norm.ppf(1 - (1 - confidence) / 2)
    centre = (k + z * z / 2) / (n + z * z)
    half = z / (n + z * z) * math.sqrt(k * (n - k) / n + z * z / 4)
    return max(0.0, centre - half), min(1.0, centre + half)


@pytest.mark.parametrize("confidence", CONFIDENCES)
def test_wilson_is_the_score_interval_closed_form(confidence):
    k, n = _counts()
    low, high = binomial_interval(k, n, confidence, "wilson")
    assert low.dtype == high.dtype == torch.float64
    for i, (ki, ni) in enumerate(zip(k.tolist(), n.tolist())):
        want_low, want_high = _wilson(ki, ni, confidence)
        assert low[i].item() == pytest.approx(want_low, rel=1e-12, abs=1e-15), (ki, ni)
        assert high[i].item() == pytest.approx(want_high, rel=1e-12, abs=1e-15), (ki, ni)


def test_wilson_edges_have_closed_forms():
    z2 = stats.norm.ppf(0.975) ** 2
    n = torch.tensor([1, 5, 100, 4000])
    low, high = binomial_interval(torch.zeros_like(n), n, 0.95, "wilson")
    np.testing.assert_allclose(low.numpy(), 0.0, atol=1e-15)
    np.testing.assert_allclose(high.numpy(), [z2 / (m + z2) for m in n.tolist()], rtol=1e-12)
    low, high = binomial_interval(n, n, 0.95, "wilson")
    np.testing.assert_allclose(high.numpy(), 1.0, atol=1e-15)
    np.testing.assert_allclose(low.numpy(), [m / (m + z2) for m in n.tolist()], rtol=1e-12)
    assert ((low >= 0) & (high <= 1)).all()


@pytest.mark.parametrize("method", INTERVALS)
def test_intervals_contain_the_estimate_and_keep_the_counts_device(method):
    k, n = _counts()
    low, high = binomial_interval(k, n, 0.95, method)
    p = k.double() / n.double()
    assert ((low <= p) & (p <= high)).all()
    assert low.device == k.device and low.shape == k.shape


def test_wilson_interval_reaches_0_and_1_exactly_at_the_edges():
    n = torch.tensor([10, 50, 1000])
    for confidence in CONFIDENCES:
        low, _ = binomial_interval(torch.zeros_like(n), n, confidence, "wilson")
        _, high = binomial_interval(n, n, confidence, "wilson")
        assert (low == 0).all() and (high == 1).all(), (confidence, low, high)


def test_unknown_interval_is_refused_by_name():
    with pytest.raises(ValueError, match=r"^interval: must be one of \('wilson', 'clopper-pearson'\)"):
        binomial_interval(torch.tensor([1]), torch.tensor([2]), 0.95, "wald")


# ---------------------------------------------------------------- the one-sided bound


@pytest.mark.parametrize("level", [0.9, 0.975, 0.999])
def test_upper_rate_is_the_one_sided_clopper_pearson_bound(level):
    k, n = _counts()
    bound = upper_rate(k, n, level)
    assert bound.dtype == torch.float64 and bound.device == k.device
    for i, (ki, ni) in enumerate(zip(k.tolist(), n.tolist())):
        if ki == ni:
            assert bound[i].item() == 1.0
        else:
            assert bound[i].item() == stats.beta.ppf(level, ki + 1, ni - ki)
            # its defining equation: the rate at which k or fewer successes has probability 1 - level
            assert stats.binom.cdf(ki, ni, bound[i].item()) == pytest.approx(1 - level, rel=1e-8)


def test_upper_rate_with_no_success_is_one_minus_the_nth_root():
    for level, n in itertools.product((0.95, 0.975), (1, 10, 1000)):
        bound = upper_rate(torch.tensor([0]), float(n), level)
        assert bound.item() == pytest.approx(1 - (1 - level) ** (1 / n), rel=1e-12)


def test_upper_rate_takes_a_scalar_or_per_point_n_and_any_count_dtype():
    k = torch.tensor([0, 3, 7])
    per_point = upper_rate(k, torch.tensor([10.0, 10.0, 10.0]), 0.95)
    assert torch.equal(upper_rate(k, 10.0, 0.95), per_point)
    assert torch.equal(upper_rate(k.double(), 10, 0.95), per_point)
    assert (per_point[1:] > per_point[:-1]).all()  # more successes, a higher bound
