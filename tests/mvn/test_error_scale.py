"""The scale of mvn_cdf's sampled error: the two-sided 99% quantile of Student's t with 7 degrees
of freedom times the standard error of the 8 replicates' means (mvn_cdf's docstring).

The coverage tests (test_cdf_tolerance.py) resolve an error understated 2x; a normal quantile
(2.576) in place of t(7)'s (3.4995) understates it by 26% and moves a 99% bound's miss rate from
1% to ~3.7%, which binomial counts over a few hundred problems cannot resolve fast. Here the
quantile is read off one stage of sampling in closed form: the replicates' sums are taken where
the integrand returns them, and the reported error must be t(7)'s quantile times their
standard error, to within the rounding of 3.4995 to 3.5.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import t as student_t

from probust.mvn import cdf, mvn_cdf, qmc
from tests.mvn._one_factor import one_factor_problems


@pytest.mark.parametrize("k", [3, 5, 9])
def test_the_sampled_error_is_t7s_99_percent_quantile_times_the_replicates_standard_error(monkeypatch, k):
    b, corr, _ = one_factor_problems(k, 1, (0.3, 0.7), seed=k)
    sums, drawn = [], []
    block_sums, qmc_cdf = qmc.block_sums, cdf.qmc_cdf

    def spy_sums(*args):
        out = block_sums(*args)
        sums.append(out.clone())
        return out

    def spy_cdf(*args, **kwargs):
        out = qmc_cdf(*args, **kwargs)
        drawn.append(out)
        return out

    monkeypatch.setattr(qmc, "block_sums", spy_sums)
    monkeypatch.setattr(cdf, "qmc_cdf", spy_cdf)
    # tol 0 and 8 x 32 samples: one stage of 32 points per replicate, so the error is that
    # stage's spread alone (no later stage's floor on it).
    p = mvn_cdf(torch.from_numpy(b), torch.from_numpy(corr), tol=0.0, max_samples=8 * 32, seed=k)
    assert len(sums) == 1 and sums[0].shape == (1, 8), [s.shape for s in sums]  # one problem, 8 replicates
    assert len(drawn) == 1 and 0.1 < float(p) < 0.9
    estimate, error = (float(v) for v in drawn[0])
    means = sums[0][0].double() / 32
    standard_error = float(means.std() / 8**0.5)
    # The estimate and error share the integrand's constant factor: their ratio is free of it.
    quantile = error / estimate * float(means.mean()) / standard_error
    assert quantile == pytest.approx(student_t.ppf(0.995, 7), rel=2e-4), quantile
