"""The statistics of randomized smoothing against independent oracles (scipy, closed forms,
numerical integration, simulation)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate, stats
from torch import Tensor

from probust.smoothing.stats import (
    binomial_test_half,
    clopper_pearson_lower,
    cs_lower,
    cs_upper,
    log_evidence_above,
    log_evidence_below,
)

KS = [0, 1, 2, 17, 50, 99, 100, 523, 99_000, 99_999, 100_000]
NS = [100, 100, 100, 100, 100, 100, 100, 1000, 100_000, 100_000, 100_000]


@pytest.mark.parametrize("alpha", [0.001, 0.05, 0.5])
def test_clopper_pearson_lower_matches_scipy_beta_quantile(alpha):
    k, n = torch.tensor(KS), torch.tensor(NS)
    got = clopper_pearson_lower(k, n, alpha)
    assert got.dtype == torch.float64 and got.shape == k.shape
    expected = np.where(k.numpy() == 0, 0.0, stats.beta.ppf(alpha, k.numpy(), n.numpy() - k.numpy() + 1))
    np.testing.assert_allclose(got.numpy(), expected, rtol=1e-12, atol=0)


def test_clopper_pearson_lower_inverts_the_binomial_tail():
    # The defining property: at the bound L, P[Binomial(n, L) >= k] = alpha exactly.
    k, n = torch.tensor(KS[1:]), torch.tensor(NS[1:])
    low = clopper_pearson_lower(k, n, 0.001).numpy()
    np.testing.assert_allclose(stats.binom.sf(k.numpy() - 1, n.numpy(), low), 0.001, rtol=1e-7)
    # and all successes: the closed form alpha^(1/n)
    assert clopper_pearson_lower(torch.tensor([100_000]), torch.tensor([100_000]), 0.001).item() == pytest.approx(
        0.001 ** (1 / 100_000), rel=1e-14
    )


def test_binomial_test_half_matches_scipy_binomtest():
    cases = [(k, n) for n in (1, 2, 7, 10, 101, 1000) for k in range(0, n + 1, max(1, n // 37))] + [(51_000, 100_000)]
    k = torch.tensor([c[0] for c in cases])
    n = torch.tensor([c[1] for c in cases])
    got = binomial_test_half(k, n).numpy()
    expected = [stats.binomtest(a, b, 0.5).pvalue for a, b in cases]
    np.testing.assert_allclose(got, expected, rtol=1e-8, atol=1e-300)


@pytest.mark.parametrize(
    ("s", "f", "p0"), [(10, 3, 0.6), (100, 0, 0.99), (50, 50, 0.3), (5, 20, 0.5), (1000, 2, 0.995)]
)
def test_log_evidence_matches_the_mixture_integral(s, f, p0):
    # The definition: the likelihood ratio of q to p0, averaged over q uniform on [p0, 1].
    def ratio(q: float) -> float:
        return math.exp(s * math.log(q / p0) + f * math.log((1 - q) / (1 - p0)))

    above = integrate.quad(ratio, p0, 1, limit=500, points=[s / (s + f)] if p0 < s / (s + f) < 1 else None)[0]
    got = log_evidence_above(torch.tensor(s), torch.tensor(s + f), p0).item()
    assert got == pytest.approx(math.log(above / (1 - p0)), rel=1e-9, abs=1e-9)
    # the mirror: q uniform on [0, p0]
    below = integrate.quad(ratio, 0, p0, limit=500)[0]
    got = log_evidence_below(torch.tensor(s), torch.tensor(s + f), p0).item()
    assert got == pytest.approx(math.log(below / p0), rel=1e-9, abs=1e-9)


def test_log_evidence_decreases_in_the_threshold_where_it_can_reject():
    # Where the evidence is below 1 (log < 0: thresholds above the observed proportion, where it
    # can never reject at any level) the incomplete beta's far tail is only accurate to ~1e-4.
    p0 = torch.linspace(0.01, 0.999, 200, dtype=torch.float64)
    for s, t in [(0, 0), (3, 10), (90, 100), (1000, 1000), (40, 1000)]:
        above = log_evidence_above(torch.tensor(s), torch.tensor(t), p0)
        below = log_evidence_below(torch.tensor(s), torch.tensor(t), p0)
        for e in (above, below.flip(0)):
            e = e[e >= 0]
            assert (e[1:] <= e[:-1] + 1e-9 * e[:-1]).all(), (s, t)


def test_cs_lower_is_the_largest_threshold_rejected():
    k = torch.tensor([5, 90, 1000, 7000, 0, 0])
    n = torch.tensor([10, 100, 1000, 7000, 50, 0])
    low = cs_lower(k, n, 0.001)
    level = math.log(1000)
    rejected = log_evidence_above(k, n, low.clamp_min(1e-300))
    assert (rejected[low > 0] >= level).all()
    assert (log_evidence_above(k, n, (low + 1e-9).clamp_max(1 - 1e-12)) < level).all()
    assert low[4] == 0 and low[5] == 0  # no ones, no draws: nothing rejected
    # the mirror
    torch.testing.assert_close(cs_upper(k, n, 0.001), 1 - cs_lower(n - k, n, 0.001), rtol=0, atol=1e-12)


def _streams(p: float, streams: int, steps: int, seed: int) -> tuple[Tensor, Tensor]:
    """Bernoulli(p) streams: (ones so far, draws so far), int64 [streams, steps] each."""
    rng = np.random.default_rng(seed)
    ones = torch.from_numpy(np.cumsum(rng.random((streams, steps)) < p, axis=1))
    return ones, torch.arange(1, steps + 1).expand_as(ones)


@pytest.mark.parametrize("p", [0.5, 0.9, 0.99])
def test_the_confidence_sequence_holds_at_every_stopping_time(p):
    # Look after every one of 300 draws and stop at the first look that excludes p (the worst
    # stopping rule there is): the share of streams ever excluding p stays below alpha.
    alpha, streams = 0.05, 2000
    k, n = _streams(p, streams, 300, seed=int(p * 1000))
    ever = (log_evidence_above(k, n, p) >= math.log(1 / alpha)).any(dim=1)
    assert ever.sum().item() <= stats.binom.ppf(1 - 1e-4, streams, alpha), (ever.double().mean(), alpha)


def test_the_simulation_sees_a_bound_that_is_not_anytime_valid():
    # The same simulation has the power to catch a bound valid only at a number of draws fixed in
    # advance: Clopper-Pearson read after every draw excludes p in far more than alpha of streams.
    alpha, streams, p = 0.05, 2000, 0.5
    k, n = _streams(p, streams, 300, seed=11)
    ever = (clopper_pearson_lower(k, n, alpha) > p).any(dim=1)
    assert ever.sum().item() > stats.binom.ppf(1 - 1e-4, streams, alpha), ever.double().mean()


def test_the_upper_sequence_holds_at_every_stopping_time():
    alpha, streams, p = 0.05, 2000, 0.8
    k, n = _streams(p, streams, 300, seed=3)
    ever = (log_evidence_below(k, n, p) >= math.log(1 / alpha)).any(dim=1)
    assert ever.sum().item() <= stats.binom.ppf(1 - 1e-4, streams, alpha), (ever.double().mean(), alpha)


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: clopper_pearson_lower(torch.tensor([3]), torch.tensor([10]), 0.0), "alpha"),
        (lambda: clopper_pearson_lower(torch.tensor([3]), torch.tensor([10]), 1.0), "alpha"),
        (lambda: clopper_pearson_lower(torch.tensor([3]), torch.tensor([10]), True), "alpha"),
        (lambda: clopper_pearson_lower(torch.tensor([11]), torch.tensor([10]), 0.1), "successes"),
        (lambda: clopper_pearson_lower(torch.tensor([-1]), torch.tensor([10]), 0.1), "successes"),
        (lambda: clopper_pearson_lower(torch.tensor([1.0]), torch.tensor([10]), 0.1), "successes"),
        (lambda: clopper_pearson_lower(torch.tensor([0]), torch.tensor([0]), 0.1), "trials"),
        (lambda: clopper_pearson_lower(torch.tensor([1, 2]), torch.tensor([3, 4, 5]), 0.1), "broadcast"),
        (lambda: binomial_test_half(torch.tensor([1]), torch.tensor([0])), "trials"),
        (lambda: log_evidence_above(torch.tensor([1]), torch.tensor([3]), 1.0), "p0"),
        (lambda: log_evidence_below(torch.tensor([1]), torch.tensor([3]), 0.0), "p0"),
        (lambda: cs_lower(torch.tensor([1]), torch.tensor([3]), 2.0), "alpha"),
        (lambda: cs_upper(torch.tensor([1]), torch.tensor([3]), -0.1), "alpha"),
    ],
)
def test_a_bad_argument_fails_naming_it(call, message):
    with pytest.raises(ValueError, match=message):
        call()
