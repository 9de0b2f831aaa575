"""MMSE's centred draws: each of the N copies of a point is exactly N(0, S), the noise.

Centring N draws (eps_j - mean) leaves each with covariance (N - 1) / N S; the rescaling by
sqrt(N / (N - 1)) restores S. Without it the copies are too close to x by a factor (N - 1) / N in
variance: 1/2 at N = 2, 4/5 at N = 5. Each check below is a chi-square test whose statistic is
exactly chi-square distributed under the claim, at a two-sided level of 1e-6 (a false failure in
about one run in 100,000 over the whole file); the factors above put the statistic 20 to 100 of
its standard deviations away.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2
from torch import nn

import probust
from probust.noise import STREAM_MMSE, Gaussian, point_keys

LEVEL = 1e-6


def _within_chi_square(statistic: float, dof: int) -> bool:
    return chi2.ppf(LEVEL / 2, dof) <= statistic <= chi2.ppf(1 - LEVEL / 2, dof)


def _copies(noise: Gaussian, n: int, points: int, d: int) -> torch.Tensor:
    """[points, n, d]: MMSE's noise draws for the copies of ``points`` points (the estimator's own)."""
    model = nn.Linear(d, 2)
    keys = point_keys(0, torch.arange(points), STREAM_MMSE)
    return probust.MMSE(model, noise, n_samples=n)._draws(keys, torch.Size([d])).double()


@pytest.mark.parametrize("n", [2, 5])
def test_each_mmse_copy_has_the_noises_second_moment(n):
    points, d = 2000, 10
    # Isotropic: sum over points and coordinates of eps_j^2 / sigma^2 is chi-square(points d).
    sigma = 0.3
    eps = _copies(Gaussian(sigma), n, points, d)
    for j in range(n):
        statistic = float(eps[:, j].square().sum()) / sigma**2
        assert _within_chi_square(statistic, points * d), (n, j, statistic / (points * d))
    # A full covariance S: whitened, ||L^-1 eps_j||^2 (S = L L^T) is chi-square(d) per point.
    gen = torch.Generator().manual_seed(n)
    a = torch.randn(d, d, generator=gen, dtype=torch.float64)
    cov = a @ a.T / d + 0.1 * torch.eye(d, dtype=torch.float64)
    eps = _copies(Gaussian(cov=cov), n, points, d)
    white = torch.linalg.solve_triangular(torch.linalg.cholesky(cov), eps.reshape(-1, d).T, upper=False)
    white = white.T.reshape(points, n, d)
    for j in range(n):
        statistic = float(white[:, j].square().sum())
        assert _within_chi_square(statistic, points * d), (n, j, statistic / (points * d))


class _HalfSquaredNorm(nn.Module):
    """Logits [3 + ||x||^2 / 2, 0]: class 0's margin over class 1 on a copy x + eps_j is
    3 + ||x + eps_j||^2 / 2 (no tie at x = 0, and not rows that look like probabilities)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([3 + 0.5 * x.flatten(1).square().sum(1), torch.zeros(len(x), dtype=x.dtype)], dim=1)


@pytest.mark.parametrize("n", [2, 5])
def test_mmses_margin_at_the_origin_is_the_mean_squared_norm_of_copies_drawn_from_the_noise(n):
    # Through the estimator: at x = 0 the margin is c = 3 + mean_j ||eps_j||^2 / 2. The centred copies
    # sum to zero, so sum_j ||eps_j||^2 = N / (N - 1) sum_j ||e_j - mean e||^2 and
    # 2 (N - 1) (c - 3) / sigma^2 is exactly chi-square(d (N - 1)) per point, independent over points.
    points, d, sigma = 500, 8, 0.5
    x = torch.zeros(points, d)
    r = probust.MMSE(_HalfSquaredNorm(), sigma, n_samples=n, prune="off", check_draws=0, cdf="mv-sigmoid")(x)
    assert (r.target == 0).all()
    statistic = float((r.margin[:, 1].double() - 3).sum()) * 2 * (n - 1) / sigma**2
    assert _within_chi_square(statistic, points * d * (n - 1)), statistic / (points * d * (n - 1))
