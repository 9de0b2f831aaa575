"""From a linearisation to a probability (probust.estimators.maps) against explicit formulas.

Oracles: z_i = c_i / sqrt(u_i S u_i^T) and the correlation of the boundaries computed one entry at
a time from an explicit covariance S; the mv-sigmoid's formula in plain Python; the closed forms
Phi(z) and Phi(-z) of a single boundary (scipy.special).
"""

from __future__ import annotations

import math

import pytest
import torch
from scipy import special

from probust.estimators import maps
from probust.noise import Gaussian

F64 = torch.float64


def _linearisation(points: int = 3, classes: int = 4, d: int = 5, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    c = torch.randn(points, classes, generator=gen).abs() + 0.1
    u = torch.randn(points, classes, d, generator=gen)
    target = torch.arange(points) % classes
    c[torch.arange(points), target] = 0.0
    u[torch.arange(points), target] = 0.0
    return c, u, target


def _covariance(d: int) -> torch.Tensor:
    a = torch.randn(d, d, generator=torch.Generator().manual_seed(4), dtype=F64) * 0.5
    return a @ a.T + 0.1 * torch.eye(d, dtype=F64)


@pytest.mark.parametrize("noise", [Gaussian(0.3), Gaussian(cov=_covariance(5))], ids=["isotropic", "full"])
def test_standardise_gives_z_and_the_correlation_of_the_other_boundaries(noise):
    c, u, target = _linearisation()
    s = 0.09 * torch.eye(5, dtype=F64) if noise.cov is None else noise.cov
    std = maps.standardise(c, u, target, noise)
    points, classes = c.shape
    for b in range(points):
        t = int(target[b])
        others = [i for i in range(classes) if i != t]
        assert std.z[b, t] == math.inf
        for row, i in enumerate(others):
            ui = u[b, i].double()
            scale = math.sqrt((ui @ s @ ui).item())
            assert std.z[b, i].item() == pytest.approx(c[b, i].item() / scale, rel=1e-12)
            assert std.z_others[b, row] == std.z[b, i]
            for col, j in enumerate(others):
                uj = u[b, j].double()
                expected = 1.0 if i == j else (ui @ s @ uj).item() / (scale * math.sqrt((uj @ s @ uj).item()))
                assert std.corr[b, row, col].item() == pytest.approx(expected, rel=1e-10, abs=1e-12)
    assert std.z.dtype == std.corr.dtype == F64 and std.corr.shape == (points, classes - 1, classes - 1)


def test_a_boundary_the_noise_cannot_move_is_never_or_always_crossed():
    c, u, target = _linearisation(points=2, classes=3)
    u[:, 1] = 0.0  # class 1's margin has no gradient (never class 1 is a target here)
    target = torch.tensor([0, 2])
    c[:, 1] = torch.tensor([0.5, -0.5])
    std = maps.standardise(c, u, target, Gaussian(0.3))
    assert std.z[0, 1] == math.inf and std.z[1, 1] == -math.inf
    assert torch.isfinite(std.corr).all()
    p, _ = maps.mvn_probability(std, tol=1e-6, seed=0)
    assert p[1] == 0 and 0 < p[0] < 1


def test_mv_sigmoid_is_one_over_one_plus_the_sum_of_exp_minus_z():
    z = torch.tensor([[0.3, 1.2, -0.4], [2.0, 5.0, 0.0]], dtype=F64)
    for row in range(2):
        expected = 1 / (1 + sum(math.exp(-v) for v in z[row].tolist()))
        assert maps.mv_sigmoid(z)[row].item() == pytest.approx(expected, rel=1e-14)
        assert maps.mv_sigmoid_fail(z)[row].item() == pytest.approx(1 - expected, rel=1e-13)


def test_mv_sigmoid_is_stable_far_from_the_boundaries():
    z = torch.tensor([[-800.0, 1.0], [40.0, 45.0], [math.inf, 3.0]], dtype=F64)
    p, fail = maps.mv_sigmoid(z), maps.mv_sigmoid_fail(z)
    assert torch.isfinite(p).all() and torch.isfinite(fail).all()
    assert p[0] == 0 and fail[0] == 1
    # a tiny failure probability keeps its relative accuracy (1 - p would be 0 in float64)
    assert fail[1].item() == pytest.approx(math.exp(-40) + math.exp(-45), rel=1e-12)
    assert p[2].item() == pytest.approx(1 / (1 + math.exp(-3)), rel=1e-14)


@pytest.mark.parametrize("z", [-1.5, 0.2, 3.0, 10.0])
def test_one_boundary_gives_phi_of_z_and_its_complement_with_relative_accuracy(z):
    # Binary model: one other class; u = (1, 0, 0), sigma = 0.5, c = 0.5 z gives that z.
    c = torch.tensor([[0.0, 0.5 * z]], dtype=F64)
    u = torch.zeros(1, 2, 3)
    u[0, 1, 0] = 1.0
    std = maps.standardise(c, u, torch.tensor([0]), Gaussian(0.5))
    p, error = maps.mvn_probability(std, tol=1e-6, seed=0)
    assert p.item() == pytest.approx(special.ndtr(z), rel=1e-12) and (error >= 0).all()
    fail, rel = maps.mvn_fail_probability(std, rtol=1e-3, seed=0)
    assert fail.item() == pytest.approx(special.ndtr(-z), rel=1e-10)
    assert (rel >= 0).all()


def test_stacked_problems_of_different_widths_give_each_problem_its_own_bits():
    # The pruned routes standardise each width group apart and integrate them in one call.
    noise = Gaussian(0.4)
    parts = []
    for seed, (points, classes) in enumerate([(3, 4), (2, 9), (4, 6)]):
        c, u, target = _linearisation(points, classes, d=12, seed=seed)
        parts.append(maps.standardise(c * 0.3, u, target, noise))
    stacked = maps.stack(parts)
    assert stacked.z.shape == (9, 9) and stacked.corr.shape == (9, 8, 8)
    p, err = maps.mvn_probability(stacked, tol=1e-5, seed=3)
    first = 0
    for part in parts:
        alone_p, alone_err = maps.mvn_probability(part, tol=1e-5, seed=3)
        rows = slice(first, first + len(alone_p))
        first += len(alone_p)
        assert torch.equal(p[rows], alone_p) and torch.equal(err[rows], alone_err)
        assert bool((stacked.z[rows, part.z.shape[1] :] == math.inf).all())
    assert maps.stack(parts[:1]) is parts[0]
