"""Input checks of mvn_cdf and mvn_sf: ValueError naming the argument; rounding is not rejected."""

from __future__ import annotations

import math

import pytest
import torch

from probust.mvn import mvn_cdf, mvn_sf


@pytest.mark.parametrize(
    "upper,cov,kwargs,match",
    [
        (torch.tensor([0.0, float("nan")]), torch.eye(2), {}, "upper"),
        (torch.zeros(2), torch.tensor([[1.0, float("nan")], [float("nan"), 1.0]]), {}, "cov"),
        (torch.zeros(2), torch.tensor([[1.0, float("inf")], [float("inf"), 1.0]]), {}, "cov"),
        (torch.zeros(3), torch.ones(3, 2), {}, "cov"),
        (torch.zeros(3), torch.eye(2), {}, "cov"),
        (torch.zeros(4, 2), torch.eye(2).expand(3, 2, 2), {}, "upper"),
        (torch.zeros(2), torch.tensor([[1.0, 0.5], [0.2, 1.0]]), {}, "symmetric"),
        (torch.zeros(2), torch.tensor([[1.0, 2.0], [2.0, 1.0]]), {}, "semi-definite"),
        (torch.zeros(2), torch.tensor([[-1.0, 0.0], [0.0, 1.0]]), {}, "semi-definite"),
        (torch.tensor(0.0), torch.eye(1), {}, "upper"),
        ([0.0, 1.0], torch.eye(2), {}, "upper"),
        (torch.zeros(2), "eye", {}, "cov"),
        (torch.zeros(2), torch.eye(2), {"tol": -1.0}, "tol"),
        (torch.zeros(2), torch.eye(2), {"max_samples": 0}, "max_samples"),
        (torch.zeros(2), torch.eye(2), {"seed": -1}, "seed"),
    ],
)
def test_bad_inputs_raise_value_error_naming_the_argument(upper, cov, kwargs, match):
    with pytest.raises(ValueError, match=match):
        mvn_cdf(upper, cov, **kwargs)


def test_rounding_of_a_singular_float32_product_is_accepted():
    u = torch.randn(30, 8, generator=torch.Generator().manual_seed(0))
    u = u / u.norm(dim=1, keepdim=True)
    cov = u @ u.T  # float32, rank 8: tiny negative eigenvalues and asymmetry from rounding
    p, err = mvn_cdf(torch.full((30,), 2.0), cov, return_error=True)
    # Oracle: X = u eps with eps ~ N(0, I_8), by plain Monte Carlo (99.9% binomial half-width).
    draws = 400_000
    eps = torch.randn(draws, 8, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    mc = ((eps @ u.double().T) <= 2.0).all(1).double().mean().item()
    half = 3.29 * math.sqrt(max(mc * (1 - mc), 1.0 / draws) / draws)
    assert abs(p.item() - mc) <= half + err.item(), (p.item(), mc, half, err.item())


@pytest.mark.parametrize("rtol", [0.0, 1.0, -0.1, "0.1", None])
def test_sf_rejects_rtol_outside_the_open_unit_interval(rtol):
    with pytest.raises(ValueError, match="rtol"):
        mvn_sf(torch.zeros(2), torch.eye(2), rtol=rtol)


def test_sf_checks_its_inputs_like_cdf():
    with pytest.raises(ValueError, match="semi-definite"):
        mvn_sf(torch.zeros(2), torch.tensor([[1.0, 2.0], [2.0, 1.0]]))
    with pytest.raises(ValueError, match="seed"):
        mvn_sf(torch.zeros(2), torch.eye(2), seed=-1)
