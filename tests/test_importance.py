"""mc_is's interval: empirical coverage against the closed form p_fail = Phi(-z) of a binary
linear model, in the CLT regime (many failures drawn) and the few/zero-failure regime.

Each point gets its own random stream (its index), so B copies of one x are B independent runs.
"""

from __future__ import annotations

import torch
from scipy import special, stats

import probust

from tests.conftest import linear_model

RUNS = 400


def _binary_point(z: float, sigma: float, d: int = 5) -> tuple[torch.nn.Module, torch.Tensor]:
    """A binary linear model and a point whose margin is z noise standard deviations."""
    model = linear_model(d, 2, seed=1)
    w = (model.weight[0] - model.weight[1]).detach()
    with torch.no_grad():
        b = (model.bias[0] - model.bias[1]).item()
    x = (z * sigma * w.norm() - b) * w / w.norm() ** 2
    return model, x


def _coverage_bounds(level: float, runs: int) -> tuple[float, float]:
    """A 99.9% range for the observed coverage of an interval whose true coverage is ``level``."""
    lo, hi = stats.binom.interval(0.999, runs, level)
    return lo / runs, hi / runs


def test_clt_interval_covers_at_the_nominal_rate_when_failures_are_many():
    sigma, z = 0.1, 4.0
    model, x = _binary_point(z, sigma)
    r = probust.MonteCarloIS(model, sigma, n_samples=200, seed=4)(x.expand(RUNS, -1), torch.zeros(RUNS, dtype=torch.long))
    truth = 1 - special.ndtr(-z)  # p_robust
    covered = ((r.ci_low <= truth) & (truth <= r.ci_high)).double().mean().item()
    lo, hi = _coverage_bounds(0.95, RUNS)
    assert lo - 0.01 <= covered <= hi, covered
    # the proposal sits on the boundary: about half the draws fail, so every run is in the CLT
    # regime, whose interval is symmetric around the estimate
    half = r.ci_high - r.p
    torch.testing.assert_close(r.p - r.ci_low, half, rtol=1e-9, atol=1e-15)


def test_interval_is_valid_and_finite_when_no_failure_is_drawn():
    # Nearly all draws nominal (defensive share 0.999): failures are rare and often absent, where
    # the CLT interval would be the single point p = 1 and miss the truth.
    sigma, z, n = 0.1, 3.0, 1000
    model, x = _binary_point(z, sigma)
    r = probust.MonteCarloIS(model, sigma, n_samples=n, defensive=0.999, seed=7)(
        x.expand(RUNS, -1), torch.zeros(RUNS, dtype=torch.long)
    )
    truth = 1 - special.ndtr(-z)
    inside = (r.ci_low <= truth) & (truth <= r.ci_high)
    none = r.p_fail == 0
    assert none.sum() >= 20, "the test wants runs without a failure"
    assert inside[none].all()
    assert torch.isfinite(r.ci_low).all() and (r.ci_low[none] < 1).all()
    # with no failure the bound is w_max (1 / 0.999) times the one-sided Clopper-Pearson bound
    expected = 1 - (1 - 0.05 ** (1 / n)) / 0.999
    torch.testing.assert_close(r.ci_low[none], torch.full_like(r.ci_low[none], expected), rtol=1e-9, atol=0)
    assert torch.isinf(r.p_fail_error[none]).all()
    # every run (zero, few or many failures) together still covers at least at the nominal rate
    lo, _ = _coverage_bounds(0.95, RUNS)
    assert inside.double().mean().item() >= lo, inside.double().mean().item()
    # and each interval contains its own estimate
    assert ((r.ci_low <= r.p) & (r.p <= r.ci_high)).all()
