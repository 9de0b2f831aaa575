"""mvn_cdf's batch invariance at high dimension, with singular covariances and +inf bounds.

mvn_cdf's docstring: a point's value does not depend on the rest of the batch (bitwise). The
batches here mix problems of different effective dimensions (tens to hundreds), scattered +inf
coordinates and low-rank correlations (a trained network's linearisation: many decision
boundaries, few independent directions), so that within the batch problems are padded to a
common dimension, exactly dependent variables become folded constraints, and the QMC blocks
(at most a few problems each at 1024 points per replicate) hold problems of different sizes.

Oracle for rank 2: X = U T with T ~ N(0, I_2) and unit rows u_i = (cos phi_i, sin phi_i). In
polar coordinates T = rho (cos t, sin t), rho is Rayleigh and (bounds b > 0) the constraints
u_i . T <= b_i read rho <= hi(t) = min over cos(t - phi_i) > 0 of b_i / cos(t - phi_i), so

    P(X <= b) = 1 - 1 / (2 pi) integral_0^{2 pi} exp(-hi(t)^2 / 2) dt,

and on the arc of directions in which constraint i binds the integral is a difference of Owen's
T functions, T(b_i, tan a) = 1 / (2 pi) integral_0^a exp(-b_i^2 / (2 cos^2 s)) ds: exact for any k.
"""

from __future__ import annotations

import functools
import math

import numpy as np
import pytest
import torch
from scipy.spatial import ConvexHull
from scipy.special import owens_t
from scipy.stats import multivariate_normal

from probust.mvn import mvn_cdf
from probust.mvn.genz import factorise

WIDTH = 160  # the batch's common number of coordinates (the rest of each problem is +inf)
# (k, rank, bound level): effective dimensions from 20 to 150, ranks 2 and 12, and full rank
SPECS = [(82, 2, 0.8), (150, 2, 1.5), (40, 2, 0.6), (20, 2, 0.5), (95, 2, 1.0)]
SPECS += [(60, 12, 1.5), (82, 12, 1.5), (120, 12, 2.0), (30, 12, 1.0), (25, 40, 1.5), (70, 200, 2.5)]


def low_rank_problem(k: int, rank: int, level: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Bounds [k] and unit factor rows U [k, rank] (correlation U U^T) of a decision-boundary-like
    problem: u_i = w_0 - w_i normalised, a few close boundaries and many far ones."""
    g = np.random.default_rng(seed)
    w = g.standard_normal((k + 1, rank))
    u = w[0] - w[1:]
    u /= np.linalg.norm(u, axis=1, keepdims=True)
    return level * (0.2 + g.exponential(1.0, k)), u


def rank2_cdf(b: np.ndarray, u: np.ndarray) -> float:
    """P(U T <= b), T ~ N(0, I_2), unit rows u [k, 2], bounds b > 0: exact (Owen's T)."""
    assert (b > 0).all()
    # In direction t the binding constraint is the point of {u_i / b_i} u {0} furthest along t:
    # a vertex of their convex hull, between the outward normals of its two edges.
    pts = np.vstack([u / b[:, None], np.zeros((1, 2))])
    v = ConvexHull(pts).vertices  # counter-clockwise
    d = pts[np.roll(v, -1)] - pts[v]  # edge j: vertex j -> vertex j + 1
    normal = np.arctan2(-d[:, 0], d[:, 1])  # outward: (d_y, -d_x)
    outside = 0.0  # (1 / 2 pi) integral of exp(-hi(t)^2 / 2) dt
    for j, i in enumerate(v):
        if i == len(b):  # the origin: directions in which the region is unbounded
            continue
        phi = math.atan2(u[i, 1], u[i, 0])
        a1, a2 = ((np.array([normal[j - 1], normal[j]]) - phi + np.pi) % (2 * np.pi)) - np.pi
        assert -np.pi / 2 - 1e-9 <= a1 <= a2 <= np.pi / 2 + 1e-9, (a1, a2)
        a1, a2 = np.clip([a1, a2], -np.pi / 2, np.pi / 2)  # tan keeps its sign at +-pi/2
        outside += owens_t(b[i], math.tan(a2)) - owens_t(b[i], math.tan(a1))
    return 1.0 - outside


def rank2_cdf_by_angle_grid(b: np.ndarray, u: np.ndarray, n: int = 400_000) -> float:
    """The same probability by the midpoint rule over the angle (a check of rank2_cdf)."""
    t = (np.arange(n) + 0.5) * (2 * np.pi / n)
    c = np.stack([np.cos(t), np.sin(t)], 1) @ u.T
    hi = np.min(np.where(c > 0, b / np.where(c > 0, c, 1.0), np.inf), 1)
    return float(1.0 - np.exp(-0.5 * hi**2).mean())


def mixed_batch() -> tuple[torch.Tensor, torch.Tensor, list[tuple[np.ndarray, np.ndarray]]]:
    """The batch [n, WIDTH] (bounds, correlations) and each problem's own (bounds, U)."""
    scatter = np.random.default_rng(99)
    zs, cs, own = [], [], []
    for i, (k, rank, level) in enumerate(SPECS):
        z, u = low_rank_problem(k, rank, level, seed=i)
        corr = np.eye(WIDTH)
        corr[:k, :k] = u @ u.T
        np.fill_diagonal(corr, 1.0)
        bounds = np.full(WIDTH, np.inf)
        bounds[:k] = z
        p = scatter.permutation(WIDTH)  # +inf coordinates anywhere, not only at the end
        zs.append(bounds[p])
        cs.append(corr[p][:, p])
        own.append((z, u))
    return torch.tensor(np.array(zs)), torch.tensor(np.array(cs)), own


@functools.cache
def _mixed_batch_cdf() -> tuple[torch.Tensor, torch.Tensor]:
    """mvn_cdf(p, error) of the whole mixed batch at the default settings, computed once for the
    tests that compare against it (~3 s each time). No test modifies the tensors."""
    z, c, _ = mixed_batch()
    result = mvn_cdf(z, c, return_error=True)
    assert isinstance(result, tuple)
    return result


def _alone(z: np.ndarray, u: np.ndarray) -> tuple[torch.Tensor, torch.Tensor]:
    corr = u @ u.T
    np.fill_diagonal(corr, 1.0)
    result = mvn_cdf(torch.tensor(z), torch.tensor(corr), return_error=True)
    assert isinstance(result, tuple)
    return result


def test_rank2_oracle_matches_scipy_a_grid_and_ignores_redundant_constraints():
    u = np.array([[math.cos(0.3), math.sin(0.3)], [math.cos(2.0), math.sin(2.0)]])
    for b in ([0.4, 0.3], [1.5, 0.7], [0.2, 2.5]):
        exact = multivariate_normal.cdf(b, cov=u @ u.T, abseps=1e-12, releps=0.0)
        assert abs(rank2_cdf(np.array(b), u) - exact) < 1e-9
    # A constraint implied by another (same direction, looser bound) changes nothing.
    b3, u3 = np.array([0.4, 0.3, 0.9]), np.vstack([u, u[:1]])
    assert abs(rank2_cdf(b3, u3) - rank2_cdf(b3[:2], u)) < 1e-14
    # Many constraints, bounded (all directions) and unbounded (directions in a half-plane).
    for k, level in ((82, 0.8), (20, 0.5)):
        z, w = low_rank_problem(k, 2, level, seed=k)
        assert abs(rank2_cdf(z, w) - rank2_cdf_by_angle_grid(z, w)) < 1e-9
    angles = np.array([0.1, 0.5, 1.0, 1.3])
    half = np.stack([np.cos(angles), np.sin(angles)], 1)
    bh = np.array([0.5, 0.7, 0.2, 0.9])
    assert abs(rank2_cdf(bh, half) - rank2_cdf_by_angle_grid(bh, half)) < 1e-9


def test_factorisation_puts_padding_after_every_variable_of_a_singular_problem():
    # The integrand runs a block for its largest problem's number of variables: a problem's
    # determined variables (folded constraints) must come before its padding, or they are cut.
    z, u = low_rank_problem(12, 2, 0.8, seed=3)
    width = 20
    zp = torch.zeros(1, width, dtype=torch.float64)
    zp[0, :12] = torch.from_numpy(z)
    corr = torch.eye(width, dtype=torch.float64)[None].clone()
    corr[0, :12, :12] = torch.from_numpy(u @ u.T)
    pad = torch.arange(width)[None] >= 12
    fac = factorise(zp, corr, pad)
    assert int(fac.steps[0]) == 12
    assert (fac.fold_step[0, 2:12] >= 0).all()  # 2 random steps, then 10 folded constraints
    assert (fac.fold_step[0, 12:] < 0).all()
    alone = factorise(zp[:, :12], corr[:, :12, :12], pad[:, :12])
    assert torch.equal(fac.fold_step[0, :12], alone.fold_step[0])
    assert torch.equal(fac.bs[0, :12], alone.bs[0])


def test_each_problem_alone_equals_its_value_in_a_mixed_batch():
    z, c, own = mixed_batch()
    p, err = _mixed_batch_cdf()
    for i, (zi, ui) in enumerate(own):
        # Alone, same width (its +inf coordinates kept): bitwise.
        pk, ek = mvn_cdf(z[i], c[i], return_error=True)
        assert torch.equal(pk, p[i]) and torch.equal(ek, err[i]), (SPECS[i], pk.item(), p[i].item())
        # Alone without its +inf coordinates: the same computation, except that the dropped
        # negligible tails are summed over a different width (rounding only).
        pa, ea = _alone(zi, ui)
        assert abs(pa.item() - p[i].item()) <= 1e-15 and abs(ea.item() - err[i].item()) <= 1e-15, SPECS[i]
    # Order and batch size do not matter either.
    perm = torch.randperm(len(z), generator=torch.Generator().manual_seed(0))
    pp, ep = mvn_cdf(z[perm], c[perm], return_error=True)
    assert torch.equal(pp, p[perm]) and torch.equal(ep, err[perm])
    ps, es = mvn_cdf(z[2:5], c[2:5], return_error=True)
    assert torch.equal(ps, p[2:5]) and torch.equal(es, err[2:5])


def test_in_batch_values_of_singular_problems_are_within_their_error_of_the_exact_value():
    z, c, own = mixed_batch()
    p, err = _mixed_batch_cdf()
    checked = 0
    for i, (zi, ui) in enumerate(own):
        if ui.shape[1] != 2:
            continue
        exact = rank2_cdf(zi, ui)
        assert abs(p[i].item() - exact) <= err[i].item(), (SPECS[i], p[i].item(), exact, err[i].item())
        checked += 1
    assert checked == 5


SCIPY_SINGULAR_ERROR = 1e-5  # scipy at abseps 1e-6 on these rank-2 problems: within 3.5e-6 of exact


def scipy_singular_cdf(z: np.ndarray, u: np.ndarray) -> float:
    """P(U T <= z) by scipy's randomised lattice rules (Genz's algorithm, scipy's own code), which
    take a singular covariance with allow_singular; slow (seconds to a minute per problem)."""
    corr = u @ u.T
    np.fill_diagonal(corr, 1.0)
    return float(
        multivariate_normal.cdf(z, cov=corr, allow_singular=True, abseps=1e-6, releps=0.0, maxpts=2_000_000, rng=0)
    )


@pytest.mark.slow(seconds=27)
def test_scipys_singular_integrator_is_within_its_error_of_the_exact_rank2_values():
    # The reference of the rank-12 test below, checked against the exact rank-2 values of the
    # same kind of problem (measured 1.4e-6 to 3.5e-6 off at abseps 1e-6).
    _, _, own = mixed_batch()
    checked = 0
    for zi, ui in own:
        if ui.shape[1] == 2 and len(zi) <= 82:
            assert abs(scipy_singular_cdf(zi, ui) - rank2_cdf(zi, ui)) <= SCIPY_SINGULAR_ERROR
            checked += 1
    assert checked == 3


RANK12 = [i for i, (_, rank, _) in enumerate(SPECS) if rank == 12]
RANK12_SECONDS = {60: 13, 82: 23, 120: 58}  # scipy's time grows with k


@pytest.mark.parametrize(
    "i",
    [
        pytest.param(i, id=f"k{SPECS[i][0]}", marks=pytest.mark.slow(seconds=RANK12_SECONDS.get(SPECS[i][0], 5)))
        for i in RANK12
    ],
)
def test_in_batch_values_of_rank12_problems_match_scipy(i):
    # No closed form at rank 12: the reference is scipy's integrator (checked above). One test per
    # problem (scipy takes seconds to a minute each), so that CI's workers share them.
    assert len(RANK12) == 4
    _, _, own = mixed_batch()
    p, err = _mixed_batch_cdf()
    zi, ui = own[i]
    assert ui.shape[1] == 12
    ref = scipy_singular_cdf(zi, ui)
    assert abs(p[i].item() - ref) <= err[i].item() + SCIPY_SINGULAR_ERROR, (SPECS[i], p[i].item(), ref)


def test_values_do_not_depend_on_how_many_problems_share_an_integrand_call(monkeypatch):
    # qmc_cdf sizes its integrand calls by the problems' width (a speed knob: smaller calls keep
    # the running sums near the cache at high dimension). Any call size gives the same bits.
    from probust.mvn import qmc

    z, c, _ = mixed_batch()
    p, err = _mixed_batch_cdf()
    assert qmc._slab(WIDTH) < qmc._SLAB  # this batch is one that gets the smaller calls
    for slab, limit in ((1 << 15, 1 << 40), (1 << 10, 1 << 10)):
        monkeypatch.setattr(qmc, "_SLAB", slab)
        monkeypatch.setattr(qmc, "_SLAB_DOUBLES", limit)
        pm, em = mvn_cdf(z, c, return_error=True)
        assert torch.equal(pm, p) and torch.equal(em, err), slab
