"""Deterministic bounds on orthant probabilities (probust.mvn.bounds) and their use in mvn_cdf."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy.stats import norm

from probust.mvn import mvn_cdf
from probust.mvn.bounds import TOP, orthant_bounds
from tests.mvn._one_factor import one_factor_problems

# Five decision boundaries of a trained ReLU CNN (Fashion-MNIST composites, C = 100, Taylor at
# sigma = 0.2): nearly parallel boundaries (correlation up to 0.92) just beyond 3 sigma. The
# failure region is a thin slab of the first QMC coordinate; 64 points per replicate missed it in
# every replicate for 5 of 20 seeds, which then reported 0.99885 +- 5e-5 and the like.
SHARP_Z = [3.1077715436771465, 3.156526786786819, 3.4241064232500147, 4.6273591441096364, 5.075203923100523]
SHARP_CORR = [
    [1.0, 0.923, 0.7684, 0.7927, 0.0681],
    [0.923, 1.0, 0.8032, 0.8912, 0.1049],
    [0.7684, 0.8032, 1.0, 0.5389, 0.0461],
    [0.7927, 0.8912, 0.5389, 1.0, 0.0995],
    [0.0681, 0.1049, 0.0461, 0.0995, 1.0],
]


def _sharp_truth() -> float:
    """The sharp problem's p by plain Monte Carlo: 4e7 draws, standard error ~6e-6."""
    gen = torch.Generator().manual_seed(0)
    chol = torch.linalg.cholesky(torch.tensor(SHARP_CORR, dtype=torch.float64))
    z = torch.tensor(SHARP_Z, dtype=torch.float64)
    inside = 0
    for _ in range(20):
        y = torch.randn(2_000_000, 5, generator=gen, dtype=torch.float64) @ chol.T
        inside += int((y <= z).all(1).sum())
    return inside / 40_000_000


def _no_pad(z: torch.Tensor) -> torch.Tensor:
    return torch.zeros_like(z, dtype=torch.bool)


@pytest.mark.parametrize("k", [3, 9, 30, 99])
def test_bounds_contain_exact_one_factor_probabilities(k):
    b, corr, ref = one_factor_problems(k, 12, (0.5, 0.9999), seed=k)
    z, r = torch.from_numpy(b), torch.from_numpy(corr)
    lower, upper = orthant_bounds(z, r, _no_pad(z))
    ref_t = torch.from_numpy(ref)
    assert (lower <= ref_t + 1e-12).all() and (ref_t <= upper + 1e-12).all()
    assert (lower <= upper).all()


def test_bounds_are_exact_for_independent_boundaries_up_to_second_order():
    gen = torch.Generator().manual_seed(1)
    z = 3 + 2 * torch.rand(20, 12, generator=gen, dtype=torch.float64)
    eye = torch.eye(12, dtype=torch.float64).expand(20, -1, -1)
    lower, upper = orthant_bounds(z, eye, _no_pad(z))
    exact = torch.from_numpy(norm.cdf(z.numpy()).prod(1))
    assert (lower <= exact + 1e-15).all() and (exact <= upper + 1e-15).all()
    # Far tails, independent: the bracket is of the order of the pairwise overlaps (~q^2 k^2).
    assert ((upper - lower) <= 1e-5).all()


def test_padding_and_problems_beyond_the_top_tails_keep_the_bounds_valid():
    b, corr, ref = one_factor_problems(60, 4, (0.9, 0.999), seed=7)
    z, r = torch.from_numpy(b), torch.from_numpy(corr)
    assert z.shape[1] > TOP  # some events enter only by count
    padded_z = torch.nn.functional.pad(z, (0, 5))
    padded_r = torch.eye(65, dtype=torch.float64).repeat(4, 1, 1)
    padded_r[:, :60, :60] = r
    pad = torch.zeros(4, 65, dtype=torch.bool)
    pad[:, 60:] = True
    lower, upper = orthant_bounds(padded_z, padded_r, pad)
    alone = orthant_bounds(z, r, _no_pad(z))
    assert torch.equal(lower, alone[0]) and torch.equal(upper, alone[1])  # padding changes no bit
    ref_t = torch.from_numpy(ref)
    assert (lower <= ref_t).all() and (ref_t <= upper).all()


def test_a_sharp_problem_is_within_its_stated_error_for_every_seed():
    truth = _sharp_truth()
    z = torch.tensor([SHARP_Z], dtype=torch.float64)
    corr = torch.tensor([SHARP_CORR], dtype=torch.float64)
    lower, upper = orthant_bounds(z, corr, _no_pad(z))
    assert lower.item() - 3e-5 <= truth <= upper.item() + 3e-5  # 3e-5: five standard errors of the truth
    for seed in range(20):
        p, err = mvn_cdf(z, corr, tol=1e-4, seed=seed, return_error=True)
        assert abs(p.item() - truth) <= err.item() + 3e-5, (seed, p.item(), err.item(), truth)


def test_bounds_that_pin_p_replace_sampling_with_a_guaranteed_error():
    # Three far, weakly correlated boundaries: p ~ 1 - 3e-5, the bounds' width ~1e-9 << tol.
    z = torch.tensor([[4.0, 4.2, 4.5]], dtype=torch.float64)
    corr = torch.tensor([[[1.0, 0.3, 0.1], [0.3, 1.0, 0.2], [0.1, 0.2, 1.0]]], dtype=torch.float64)
    lower, upper = orthant_bounds(z, corr, _no_pad(z))
    p, err = mvn_cdf(z, corr, return_error=True)
    assert p.item() == pytest.approx(((lower + upper) / 2).item(), abs=0.0)
    assert err.item() == pytest.approx(((upper - lower) / 2).item(), rel=1e-12)
    exact = float(np.prod(norm.cdf([4.0, 4.2, 4.5])))  # independent would be within ~1e-9 here
    assert abs(p.item() - exact) < 1e-6


def test_bounds_are_differentiable_where_autograd_is_on():
    z = torch.tensor([[2.5, 2.8, 3.0, 3.3]], dtype=torch.float64, requires_grad=True)
    corr = torch.full((1, 4, 4), 0.4, dtype=torch.float64).diagonal_scatter(
        torch.ones(1, 4, dtype=torch.float64), 0, 1, 2
    )
    lower, upper = orthant_bounds(z, corr, _no_pad(z.detach()))
    (lower + upper).sum().backward()
    assert z.grad is not None and (z.grad > 0).all()  # raising a bound raises p
