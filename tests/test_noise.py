"""Noise models (probust.noise): their laws, per-point draws, shapes, quadratic form and argument checks.

Oracles: the theoretical mean, variance and covariance of each law (every moment check is a
two-sided bound at Z = 5.5 standard errors: a false alarm has probability ~4e-8 per check),
scipy's Kolmogorov-Smirnov test against the exact distribution (threshold p > 1e-6), and
``u S u^T`` computed from the explicit covariance matrix S.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from scipy import stats

from probust.errors import OptionError
from probust.noise import (
    STREAM_MC,
    STREAM_MMSE,
    Gaussian,
    Laplace,
    Noise,
    Uniform,
    as_noise,
    point_keys,
    require_gaussian,
)

Z = 5.5  # standard errors allowed by each moment check
KS_P = 1e-6  # smallest Kolmogorov-Smirnov p-value accepted
POINTS, DRAWS = 4, 5000  # 20,000 draws of each coordinate


def _keys(points: int = POINTS, seed: int = 0) -> torch.Tensor:
    return point_keys(seed, torch.arange(points), STREAM_MC)


def _draws(noise: Noise, shape: tuple[int, ...]) -> np.ndarray:
    """[POINTS * DRAWS, d] float64 draws, one row per draw."""
    eps = noise.sample(_keys(), 0, DRAWS, torch.Size(shape))
    assert eps.dtype == torch.float32 and eps.shape == (POINTS, DRAWS, *shape)
    return eps.reshape(POINTS * DRAWS, -1).double().numpy()


def _check_moments(draws: np.ndarray, std: np.ndarray, kurtosis: float) -> None:
    """Zero mean and variance std^2 per coordinate, for a law with this (non-excess) kurtosis."""
    n = draws.shape[0]
    mean, var = draws.mean(0), draws.var(0, ddof=1)
    assert (np.abs(mean) <= Z * std / math.sqrt(n)).all(), (mean, std)
    # Var(s^2) = (mu_4 - sigma^4) / n = (kurtosis - 1) sigma^4 / n
    assert (np.abs(var - std**2) <= Z * std**2 * math.sqrt((kurtosis - 1) / n)).all(), (var, std**2)


# ---------------------------------------------------------------- the laws


def test_isotropic_gaussian_has_mean_zero_and_std_sigma_and_is_normal():
    sigma = 0.7
    draws = _draws(Gaussian(sigma), (2, 3))
    _check_moments(draws, np.full(6, sigma), kurtosis=3.0)
    assert stats.kstest(draws[:, 4], stats.norm(scale=sigma).cdf).pvalue > KS_P


def test_per_coordinate_gaussian_has_each_coordinates_std_and_zero_where_it_is_zero():
    std = torch.tensor([[0.1, 0.5, 1.0], [2.0, 0.0, 0.3]])
    draws = _draws(Gaussian(std), (2, 3))
    expected = std.flatten().double().numpy()
    moving = expected > 0
    _check_moments(draws[:, moving], expected[moving], kurtosis=3.0)
    assert (draws[:, ~moving] == 0).all()
    # and a std that broadcasts: one per channel of a [2, 1, 2] input
    per_channel = torch.tensor([0.5, 2.0]).view(2, 1, 1)
    draws = _draws(Gaussian(per_channel), (2, 1, 2))
    _check_moments(draws, np.array([0.5, 0.5, 2.0, 2.0]), kurtosis=3.0)


def _covariance(d: int, seed: int, rank: int | None = None) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(d, rank or d, generator=gen, dtype=torch.float64) * 0.6
    return a @ a.T + (0 if rank else 0.05) * torch.eye(d, dtype=torch.float64)


@pytest.mark.parametrize("rank", [None, 2], ids=["full-rank", "singular"])
def test_full_covariance_gaussian_has_that_covariance(rank):
    cov = _covariance(4, seed=3, rank=rank)
    draws = _draws(Gaussian(cov=cov), (4,))
    s = cov.numpy()
    n = draws.shape[0]
    assert (np.abs(draws.mean(0)) <= Z * np.sqrt(np.diag(s) / n)).all()
    sample = np.cov(draws, rowvar=False)
    # For Gaussian draws Var(sample cov_ij) = (S_ii S_jj + S_ij^2) / n (to O(1/n^2)).
    se = np.sqrt((np.outer(np.diag(s), np.diag(s)) + s**2) / n)
    assert (np.abs(sample - s) <= Z * se + 1e-12).all(), (sample, s)
    # Any direction's projection is normal with variance v S v^T.
    v = np.array([0.3, -1.0, 0.5, 0.2])
    assert stats.kstest(draws @ v, stats.norm(scale=math.sqrt(v @ s @ v)).cdf).pvalue > KS_P
    if rank is not None:  # singular: the draws stay in the column space of S
        null = np.linalg.eigh(s)[1][:, 0]
        assert np.abs(draws @ null).max() < 1e-5


def test_uniform_has_std_sigma_on_plus_minus_sqrt3_sigma():
    sigma = 0.4
    draws = _draws(Uniform(sigma), (3,))
    a = math.sqrt(3) * sigma
    assert (np.abs(draws) <= a).all()
    _check_moments(draws, np.full(3, sigma), kurtosis=9 / 5)
    assert stats.kstest(draws[:, 1], stats.uniform(loc=-a, scale=2 * a).cdf).pvalue > KS_P


def test_laplace_has_std_sigma_and_scale_sigma_over_sqrt2():
    sigma = 0.4
    draws = _draws(Laplace(sigma), (3,))
    _check_moments(draws, np.full(3, sigma), kurtosis=6.0)
    assert stats.kstest(draws[:, 2], stats.laplace(scale=sigma / math.sqrt(2)).cdf).pvalue > KS_P


# ---------------------------------------------------------------- per-point draws

NOISES = {
    "gaussian": lambda: Gaussian(0.3),
    "gaussian-std": lambda: Gaussian(torch.tensor([0.1, 0.2, 0.0, 0.4, 0.5, 0.6]).view(2, 3)),
    "gaussian-cov": lambda: Gaussian(cov=_covariance(6, seed=1)),
    "uniform": lambda: Uniform(0.3),
    "laplace": lambda: Laplace(0.3),
}


@pytest.mark.parametrize("kind", list(NOISES))
def test_a_points_draws_depend_on_its_key_only_not_on_the_batch(kind):
    noise = NOISES[kind]()
    shape = torch.Size([2, 3])
    keys = _keys(5, seed=7)
    whole = noise.sample(keys, 0, 40, shape)
    assert whole.shape == (5, 40, 2, 3) and whole.dtype == torch.float32
    assert torch.equal(noise.sample(keys[2:3], 0, 40, shape), whole[2:3])
    assert torch.equal(noise.sample(keys[[4, 0]], 0, 40, shape), whole[[4, 0]])
    # samples continue where a previous call stopped
    assert torch.equal(torch.cat([noise.sample(keys, 0, 15, shape), noise.sample(keys, 15, 25, shape)], 1), whole)
    # other keys (another seed, another stream) draw other noise
    other = point_keys(7, torch.arange(5), STREAM_MMSE)
    assert not torch.equal(noise.sample(other, 0, 40, shape), whole)
    assert not torch.equal(whole[0], whole[1])


# ---------------------------------------------------------------- shapes


def test_check_shape_refuses_a_covariance_of_the_wrong_size():
    noise = Gaussian(cov=torch.eye(6, dtype=torch.float64))
    noise.check_shape(torch.Size([2, 3]))
    noise.check_shape(torch.Size([6]))
    with pytest.raises(ValueError, match=r"^cov is \(6, 6\) but inputs have 5 coordinates"):
        noise.check_shape(torch.Size([5]))


def test_check_shape_refuses_a_std_that_does_not_broadcast():
    noise = Gaussian(torch.tensor([0.1, 0.2, 0.3]))
    noise.check_shape(torch.Size([2, 3]))
    noise.check_shape(torch.Size([3]))
    with pytest.raises(ValueError, match=r"^sigma of shape \(3,\) does not broadcast to the input shape \(2, 4\)"):
        noise.check_shape(torch.Size([2, 4]))


@pytest.mark.parametrize("noise", [Gaussian(0.2), Uniform(0.2), Laplace(0.2)], ids=["gaussian", "uniform", "laplace"])
def test_isotropic_noise_fits_any_input_shape(noise):
    for shape in ([1], [3, 8, 8], [1000]):
        noise.check_shape(torch.Size(shape))


# ---------------------------------------------------------------- quadratic form


def _explicit_covariance(kind: str, noise: Noise, d: int) -> torch.Tensor:
    if kind in ("gaussian", "uniform", "laplace"):
        return noise.sigma**2 * torch.eye(d, dtype=torch.float64)  # type: ignore[attr-defined]
    if kind == "gaussian-std":
        return torch.diag(noise.std.double().flatten() ** 2)  # type: ignore[attr-defined]
    return noise.cov  # type: ignore[attr-defined]


@pytest.mark.parametrize("kind", list(NOISES))
def test_quadratic_form_is_u_s_u_transpose(kind):
    noise = NOISES[kind]()
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(3, 4, 2, 3, generator=gen)  # [B, k, *S]
    q = noise.quadratic_form(u)
    assert q.dtype == torch.float64 and q.shape == (3, 4, 4)
    s = _explicit_covariance(kind, noise, 6)
    flat = u.flatten(2).double()
    expected = torch.einsum("bkd,de,ble->bkl", flat, s, flat)
    torch.testing.assert_close(q, expected, rtol=1e-12, atol=1e-12)


# ---------------------------------------------------------------- arguments


def test_as_noise_turns_numbers_and_tensors_into_gaussians_and_passes_noise_through():
    laplace = Laplace(0.1)
    assert as_noise(laplace) is laplace
    assert isinstance(as_noise(0.5), Gaussian) and as_noise(0.5).sigma == 0.5
    assert as_noise(torch.tensor(0.5)).sigma == 0.5  # a one-element tensor is a number
    std = as_noise(torch.tensor([0.1, 0.2]))
    assert isinstance(std, Gaussian) and std.sigma is None and torch.equal(std.std, torch.tensor([0.1, 0.2]))


@pytest.mark.parametrize(
    "sigma, match",
    [
        (None, r"^sigma: required"),
        (True, r"^sigma: must be a positive number"),
        (0, r"^sigma: must be a positive"),
        (-0.5, r"^sigma: must be a positive"),
        (math.nan, r"^sigma: must be a positive"),
        (math.inf, r"^sigma: must be a positive"),
        ("a", r"^sigma: must be a positive"),
        (torch.zeros(3), r"^sigma: per-coordinate standard deviations must be"),
        (torch.tensor([0.1, -0.1]), r"^sigma: per-coordinate standard deviations must be"),
        (torch.tensor([0.1, math.nan]), r"^sigma: per-coordinate standard deviations must be"),
    ],
)
def test_as_noise_refuses_bad_sigma_by_name(sigma, match):
    with pytest.raises(OptionError, match=match) as error:  # a ValueError
        as_noise(sigma)
    assert error.value.field == "sigma"


@pytest.mark.parametrize("cls", [Uniform, Laplace])
@pytest.mark.parametrize("sigma", [0, -1.0, math.nan, "x"])
def test_non_gaussian_noise_refuses_bad_sigma_by_name(cls, sigma):
    with pytest.raises(ValueError, match=r"^sigma: must be a positive"):
        cls(sigma)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        (dict(), r"exactly one of sigma .* or cov"),
        (dict(sigma=0.1, cov=torch.eye(2)), r"exactly one of sigma .* or cov"),
        (dict(cov=torch.ones(2, 3)), r"^cov: must be a square matrix"),
        (dict(cov=torch.ones(4)), r"^cov: must be a square matrix"),
        (dict(cov=torch.tensor([[1.0, 0.5], [0.0, 1.0]])), r"^cov: must be a finite symmetric matrix"),
        (dict(cov=torch.tensor([[1.0, math.nan], [math.nan, 1.0]])), r"^cov: must be a finite symmetric matrix"),
        (dict(cov=torch.tensor([[1.0, 2.0], [2.0, 1.0]])), r"^cov: must be positive semi-definite"),
    ],
)
def test_gaussian_refuses_bad_covariances_by_name(kwargs, match):
    with pytest.raises(OptionError, match=match) as error:
        Gaussian(**kwargs)
    assert error.value.field in (None, "cov")


def test_require_gaussian_names_the_method_and_accepts_every_gaussian():
    for noise in (Gaussian(0.1), Gaussian(torch.tensor([0.1, 0.2])), Gaussian(cov=torch.eye(2))):
        require_gaussian(noise, "mc_cv")
    for noise in (Uniform(0.1), Laplace(0.1)):
        with pytest.raises(ValueError, match=r"^sigma: mc_is needs Gaussian noise"):
            require_gaussian(noise, "mc_is")


@pytest.mark.parametrize("kind", list(NOISES))
def test_describe_is_json_and_names_the_noise(kind):
    noise = NOISES[kind]()
    description = json.loads(json.dumps(noise.describe()))
    assert description["noise"].split("-")[0] in ("gaussian", "uniform", "laplace")
    assert noise.is_gaussian == kind.startswith("gaussian")
