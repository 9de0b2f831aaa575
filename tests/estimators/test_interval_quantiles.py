"""The normal quantile in the intervals of mc_cv and mc_is, in closed form, at two confidences.

Their coverage tests count intervals that miss at the default 95%: a quantile of a lower level
(1.645 for 90% in place of 1.96) moves the miss rate from 5% to ~10%, about what 240 intervals
can just see. Here each unclipped interval's half-width must be the normal quantile at
1 - (1 - confidence) / 2 times the reported standard error (mc_cv: plus |beta| times the
linearisation's cdf_error, which the control variate's mean carries), at 0.95 and at 0.8.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import norm
from torch import nn

import probust


def _toy() -> nn.Module:
    """A small tanh network on R^10 with 4 classes (non-linear at sigma 0.3)."""
    gen = torch.Generator().manual_seed(0)
    model = nn.Sequential(nn.Linear(10, 32), nn.Tanh(), nn.Linear(32, 4))
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (1.0 if p.ndim == 1 else 0.6))
    return model


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_mc_cv_half_width_is_the_normal_quantile_times_its_standard_error_plus_the_mean_error(confidence):
    x = torch.randn(8, 10, generator=torch.Generator().manual_seed(1)) * 0.4
    r = probust.MonteCarloCV(_toy(), 0.3, n_samples=400, confidence=confidence)(x)
    inside = (r.ci_low > 0) & (r.ci_high < 1)
    assert inside.sum() >= 4, (r.ci_low, r.ci_high)  # the premise: intervals that were not clipped
    quantile = norm.ppf(1 - (1 - confidence) / 2)
    half = quantile * r.stderr + r.cv_beta.abs() * r.cdf_error
    torch.testing.assert_close(((r.ci_high - r.ci_low) / 2)[inside], half[inside], rtol=1e-9, atol=0)
    torch.testing.assert_close(((r.ci_high + r.ci_low) / 2)[inside], r.p[inside], rtol=0, atol=1e-12)


@pytest.mark.parametrize("confidence", [0.95, 0.8])
def test_mc_is_half_width_is_the_normal_quantile_times_its_standard_error(confidence):
    x = torch.randn(8, 10, generator=torch.Generator().manual_seed(1)) * 0.4
    r = probust.MonteCarloIS(_toy(), 0.3, n_samples=400, confidence=confidence)(x)
    # Points with enough failures for the normal interval (fewer use a binomial bound instead).
    normal = (r.p_fail * 400 >= 2 * probust.MonteCarloIS.MIN_FAILURES) & (r.ci_low > 0) & (r.ci_high < 1)
    assert normal.sum() >= 4, r.p_fail
    quantile = norm.ppf(1 - (1 - confidence) / 2)
    torch.testing.assert_close(
        ((r.ci_high - r.ci_low) / 2)[normal], (quantile * r.stderr)[normal], rtol=1e-9, atol=1e-15
    )
