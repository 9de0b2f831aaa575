"""The Monte Carlo family's stated defaults and mc_is's switch between its two intervals, held
against what the docs say, not against the constants themselves.

- mc, mc_cv and mc_is draw the paper's M = 10,000 noisy copies per point by default, with a 95%
  interval (``monte_carlo.DEFAULT_DRAWS``, ``DEFAULT_CONFIDENCE``; docs/estimators.md).
- mc_is's interval is the CLT's from 10 observed failures on, and below 10 the count-based bound
  w_max * U, U the Clopper-Pearson upper bound of the failure count and w_max = 1 / a (the
  nominal share ``defensive``), with 0 as its other end (docs/estimators.md, "Why 10").
"""

from __future__ import annotations

import numpy as np
import torch
from scipy import stats

import probust
from probust.estimators import importance
from tests._helpers import linear_model


def _binary_point(z: float, sigma: float, d: int = 5) -> tuple[torch.nn.Module, torch.Tensor]:
    """A binary linear model and a point whose margin is z noise standard deviations."""
    model = linear_model(d, 2, seed=1)
    w = (model.weight[0] - model.weight[1]).detach()
    with torch.no_grad():
        b = (model.bias[0] - model.bias[1]).item()
    return model, (z * sigma * w.norm() - b) * w / w.norm() ** 2


def test_monte_carlo_draws_the_papers_ten_thousand_copies_with_a_95_percent_wilson_interval():
    model, x = _binary_point(1.0, 0.2)
    r = probust.MonteCarlo(model, 0.2)(x.expand(6, -1))
    assert r.n_samples.tolist() == [10_000] * 6 and r.confidence == 0.95
    k = torch.round(r.p * 10_000).long().tolist()
    ends = np.array([tuple(stats.binomtest(j, 10_000).proportion_ci(0.95, method="wilson")) for j in k])
    np.testing.assert_allclose(r.ci_low.numpy(), ends[:, 0], rtol=1e-9)
    np.testing.assert_allclose(r.ci_high.numpy(), ends[:, 1], rtol=1e-9)


def test_the_monte_carlo_variants_draw_ten_thousand_copies_at_95_percent_by_default():
    model, _ = _binary_point(1.0, 0.2)
    for estimator in (probust.MonteCarlo, probust.MonteCarloCV, probust.MonteCarloIS):
        made = estimator(model, 0.2)
        assert (made.n_samples, made.confidence) == (10_000, 0.95), estimator


def test_mc_is_switches_to_its_count_bound_below_ten_failures_and_not_at_ten(monkeypatch):
    # The proposal sits on the boundary and gets 2% of 1,000 draws: about half of those fail,
    # so the points' failure counts spread around 10. Each point's count is read where mc_is
    # hands it to the bound (the wrapper returns what the bound returns).
    counts: list[torch.Tensor] = []
    real = importance.upper_rate

    def recording(k, n, level):
        counts.append(k.clone())
        return real(k, n, level)

    monkeypatch.setattr(importance, "upper_rate", recording)
    sigma, defensive, n, runs = 0.1, 0.98, 1000, 300
    model, x = _binary_point(3.0, sigma)
    r = probust.MonteCarloIS(model, sigma, n_samples=n, defensive=defensive, seed=3)(
        x.expand(runs, -1), torch.zeros(runs, dtype=torch.long)
    )
    k = torch.cat(counts).numpy()
    assert len(k) == runs and {9, 10} <= set(k.tolist())  # both sides of the switch are seen
    few = k < 10
    bound = np.where(k >= n, 1.0, stats.beta.ppf(0.95, k + 1, np.maximum(n - k, 1e-300))) / defensive
    np.testing.assert_allclose(r.ci_low.numpy()[few], np.clip(1 - bound[few], 0, 1), rtol=1e-9, atol=1e-12)
    assert (r.ci_high.numpy()[few] == 1.0).all()
    half = stats.norm.ppf(0.975) * r.stderr.numpy()
    np.testing.assert_allclose(r.ci_low.numpy()[~few], np.clip(r.p.numpy() - half, 0, 1)[~few], rtol=1e-9, atol=1e-12)
