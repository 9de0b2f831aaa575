"""Nearly determined variables: the split of probust.mvn.qmc (docs/mvn.md, "Nearly singular correlations").

A variable whose conditional sd at its Genz step is small is a sharp function of earlier ones;
where its constraint can still fail, the failure region can be too thin for any of the 8
replicates' first points, which then agree and report a tiny error. Oracle for the family below:
X_a, X_b independent N(0, 1) and X_c = alpha X_a + beta X_b + s E (alpha^2 + beta^2 + s^2 = 1), so
given X_a = x the pair (X_b, X_c) is bivariate normal and

    P(X_a <= a, X_b <= b, X_c <= c) = integral_{-inf}^{a} phi(x) Phi_2(b, (c - alpha x) / r; beta / r) dx,

r = sqrt(beta^2 + s^2): a one-dimensional integral of the bivariate closed form (~1e-13).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import integrate
from scipy.stats import norm

from probust.mvn import mvn_cdf
from probust.mvn.bivariate import bvn_cdf
from probust.mvn.genz import factorise

# Thirteen decision boundaries of a ReLU CNN (benchmarks/bench_prune.py: Fashion-MNIST
# composites, C = 100, Taylor at sigma = 0.2, pruned route, test point 22). The correlation's
# smallest eigenvalue is 8.9e-6; the boundary with bound 2.249 has conditional sd 0.028 at its
# Genz step, and fails only where the first two steps' draws are both near their tops (2.2e-4 of
# the cube). A development version before 0.4.0 returned 0.780247 +- 3.7e-6 for every seed.
NEAR_SINGULAR_Z = [
    4.217634343472741,
    4.634023998667588,
    3.903271829097356,
    0.7856924797250748,
    4.570419914768766,
    4.5299417548740974,
    2.5736583860379545,
    2.2493052530489974,
    4.226513164746182,
    2.8698145140388576,
    4.563008693260144,
    3.8927715623905086,
    4.140062770092035,
]
NEAR_SINGULAR_CORR = [
    [
        1.0,
        0.45171022361457874,
        0.4395989218041567,
        0.6850290571603318,
        0.8073371567209321,
        0.8952950226864747,
        0.7092941199957731,
        0.9679320222328299,
        0.6557372282769984,
        0.93692240235171,
        0.8478244653077662,
        0.9639937905702498,
        0.9380350616450531,
    ],
    [
        0.4517102236145787,
        1.0,
        0.6848166150310305,
        0.574849629144667,
        0.7140855778636176,
        0.45415449715827794,
        0.13293931527657352,
        0.4100885322185815,
        -0.03374116117001498,
        0.36123877640096613,
        0.3029176176880819,
        0.3469568361126975,
        0.20237195384827736,
    ],
    [
        0.43959892180415666,
        0.6848166150310305,
        1.0,
        0.6887473500984486,
        0.4785917232587465,
        0.5015607037534872,
        -0.07266468910375112,
        0.3558641671509708,
        -0.17119161617492296,
        0.38625871576871995,
        0.49778140611498617,
        0.3894693088047519,
        0.37121076833068195,
    ],
    [
        0.6850290571603319,
        0.574849629144667,
        0.6887473500984487,
        1.0,
        0.45190925991588016,
        0.45637432676888273,
        0.04851348029408692,
        0.6942491968491019,
        0.006741360292756601,
        0.7562144898810145,
        0.8239699971041852,
        0.6980136067465357,
        0.6461997395488552,
    ],
    [
        0.8073371567209321,
        0.7140855778636176,
        0.4785917232587465,
        0.45190925991588016,
        1.0,
        0.9040405360721802,
        0.7624619635588572,
        0.801317599390046,
        0.5038056667317324,
        0.6308781809052524,
        0.44992716665053706,
        0.6657891223769014,
        0.5943933094828759,
    ],
    [
        0.8952950226864747,
        0.4541544971582779,
        0.501560703753487,
        0.45637432676888273,
        0.90404053607218,
        1.0,
        0.8168133365738056,
        0.8630455102941439,
        0.6557680916687831,
        0.7536841501147546,
        0.6147141050968694,
        0.8043005699600222,
        0.803973645563597,
    ],
    [
        0.7092941199957731,
        0.13293931527657354,
        -0.07266468910375112,
        0.04851348029408691,
        0.7624619635588573,
        0.8168133365738056,
        1.0,
        0.7420694680694435,
        0.8152157677666324,
        0.5574391465626413,
        0.3035912452448324,
        0.614577250949762,
        0.6128775928599579,
    ],
    [
        0.9679320222328298,
        0.41008853221858155,
        0.3558641671509708,
        0.6942491968491019,
        0.8013175993900461,
        0.8630455102941439,
        0.7420694680694435,
        1.0,
        0.5959352953011988,
        0.9131206607553953,
        0.7863899241799672,
        0.9154241926535382,
        0.8939832923447137,
    ],
    [
        0.6557372282769984,
        -0.03374116117001498,
        -0.17119161617492296,
        0.006741360292756601,
        0.5038056667317324,
        0.655768091668783,
        0.8152157677666325,
        0.5959352953011988,
        1.0,
        0.6474004689038088,
        0.4489053966205167,
        0.6952344500609333,
        0.6798434853875739,
    ],
    [
        0.93692240235171,
        0.36123877640096613,
        0.38625871576871995,
        0.7562144898810145,
        0.6308781809052523,
        0.7536841501147546,
        0.5574391465626414,
        0.9131206607553953,
        0.6474004689038088,
        1.0,
        0.9198763865205266,
        0.9831611047247942,
        0.9390398394106874,
    ],
    [
        0.8478244653077662,
        0.3029176176880819,
        0.49778140611498617,
        0.8239699971041853,
        0.44992716665053706,
        0.6147141050968694,
        0.3035912452448324,
        0.7863899241799671,
        0.4489053966205167,
        0.9198763865205266,
        1.0,
        0.9165047533726598,
        0.9078426017035636,
    ],
    [
        0.9639937905702498,
        0.34695683611269795,
        0.3894693088047514,
        0.698013606746536,
        0.6657891223769031,
        0.8043005699600223,
        0.6145772509497633,
        0.915424192653538,
        0.6952344500609337,
        0.9831611047247937,
        0.9165047533726596,
        1.0,
        0.9535103711380464,
    ],
    [
        0.9380350616450537,
        0.20237195384827739,
        0.37121076833068195,
        0.6461997395488552,
        0.5943933094828762,
        0.803973645563597,
        0.6128775928599582,
        0.8939832923447145,
        0.6798434853875738,
        0.939039839410686,
        0.9078426017035645,
        0.9535103711380464,
        1.0,
    ],
]
# Reference: the unsplit integrand at 2^20 points per replicate gives 0.7800822 +- 8.1e-6; the
# split at tol 1e-7 gives 0.7800850 (seed 9) and 0.7800819 (seed 11), further apart than their
# own spreads (1.3e-7, 6.5e-7): its terms hide a little of their integrands too, which is why a
# split problem claims no less than its target.
NEAR_SINGULAR_P = 0.780083
NEAR_SINGULAR_ERROR = 1e-5


def _tensors(z: list[float], corr: list[list[float]]) -> tuple[torch.Tensor, torch.Tensor]:
    c = torch.tensor(corr, dtype=torch.float64)
    return torch.tensor(z, dtype=torch.float64), 0.5 * (c + c.T)


def test_a_real_near_singular_problem_is_within_its_stated_error_for_every_seed():
    z, corr = _tensors(NEAR_SINGULAR_Z, NEAR_SINGULAR_CORR)
    for seed in range(8):
        p, err = mvn_cdf(z, corr, seed=seed, return_error=True)
        off = abs(p.item() - NEAR_SINGULAR_P)
        assert off <= err.item() + NEAR_SINGULAR_ERROR, (seed, p.item(), err.item())
        assert err.item() <= 1e-4  # stopped on tol, not on max_samples
        assert off < 2e-5  # the split resolves the failure region, not just a wider error


def _wedge_exact(a: float, b: float, c: float, alpha: float, beta: float, s: float) -> float:
    r = math.sqrt(beta * beta + s * s)

    def inner(x: float) -> float:
        args = (torch.tensor([v], dtype=torch.float64) for v in (b, (c - alpha * x) / r, beta / r))
        return float(bvn_cdf(*args)) * norm.pdf(x)

    kink = (c - beta * b) / alpha  # where X_c's constraint starts to bind inside X_b's
    val, _ = integrate.quad(
        inner, -12.0, a, points=[kink] if -12.0 < kink < a else None, epsabs=1e-14, epsrel=1e-13, limit=500
    )
    return val


def _wedges(n: int, seed: int) -> list[tuple[np.ndarray, np.ndarray, float]]:
    """n problems (bounds [7], correlation [7, 7], exact p): the wedge of X_a, X_b, X_c, its
    corner within 0.12 of the binding bound, s in [0.003, 0.05], and four independent
    constraints that only multiply p."""
    g = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        s = 10 ** g.uniform(-2.5, -1.3)
        theta = g.uniform(0.3, 1.2)
        alpha, beta = math.cos(theta) * math.sqrt(1 - s * s), math.sin(theta) * math.sqrt(1 - s * s)
        a, b = g.uniform(0.3, 1.2), g.uniform(1.5, 2.8)
        c = alpha * a + beta * b - g.uniform(0.0, 0.12)
        extra = g.uniform(2.5, 3.5, 4)
        corr = np.eye(7)
        corr[0, 2] = corr[2, 0] = alpha
        corr[1, 2] = corr[2, 1] = beta
        p = _wedge_exact(a, b, c, alpha, beta, s) * float(np.prod(norm.cdf(extra)))
        out.append((np.concatenate([[a, b, c], extra]), corr, p))
    return out


def test_the_wedge_oracle_matches_plain_monte_carlo():
    z, corr, p = _wedges(1, seed=5)[0]
    gen = torch.Generator().manual_seed(0)
    chol = torch.linalg.cholesky(torch.tensor(corr) + 1e-15 * torch.eye(7, dtype=torch.float64))
    inside = 0
    for _ in range(5):
        x = torch.randn(1_000_000, 7, generator=gen, dtype=torch.float64) @ chol.T
        inside += int((x <= torch.tensor(z)).all(1).sum())
    assert abs(inside / 5_000_000 - p) < 5 * math.sqrt(p * (1 - p) / 5_000_000)


def test_a_constraint_nearly_determined_by_two_others_is_within_its_stated_error():
    over = []
    for i, (z, corr, p) in enumerate(_wedges(24, seed=1)):
        fac = factorise(torch.tensor(z)[None], torch.tensor(corr)[None], torch.zeros(1, 7, dtype=torch.bool))
        assert float(fac.cond_sd.min()) < 0.06  # the family is nearly singular
        for seed in range(3):
            got, err = mvn_cdf(torch.tensor(z), torch.tensor(corr), seed=seed, return_error=True)
            if abs(got.item() - p) > err.item():
                over.append((i, seed, got.item(), err.item(), p))
    assert not over, over


def _batch() -> tuple[torch.Tensor, torch.Tensor]:
    """The real problem, two wedges and a well-conditioned problem, padded to 13 with +inf."""
    width = 13
    z0, c0 = _tensors(NEAR_SINGULAR_Z, NEAR_SINGULAR_CORR)
    zs, cs = [z0], [c0]
    for z, corr, _ in _wedges(2, seed=3):
        zp = torch.full((width,), torch.inf, dtype=torch.float64)
        zp[:7] = torch.tensor(z)
        cp = torch.eye(width, dtype=torch.float64)
        cp[:7, :7] = torch.tensor(corr)
        zs.append(zp)
        cs.append(cp)
    well = torch.full((width,), torch.inf, dtype=torch.float64)
    well[:5] = torch.tensor([0.5, 1.0, 1.5, 0.8, 1.2], dtype=torch.float64)
    cw = torch.eye(width, dtype=torch.float64)
    cw[:5, :5] = 0.5 + 0.5 * torch.eye(5, dtype=torch.float64)
    zs.append(well)
    cs.append(cw)
    return torch.stack(zs), torch.stack(cs)


def test_split_problems_keep_their_values_alone_in_a_batch_and_with_autograd():
    z, corr = _batch()
    p, err = mvn_cdf(z, corr, return_error=True)
    for i in range(len(z)):
        alone, alone_err = mvn_cdf(z[i], corr[i], return_error=True)
        assert torch.equal(alone, p[i]) and torch.equal(alone_err, err[i])
    zg = z.clone().requires_grad_()
    pg, errg = mvn_cdf(zg, corr, return_error=True)
    assert torch.equal(pg.detach(), p) and torch.equal(errg, err)
    pg.sum().backward()
    assert zg.grad is not None and torch.isfinite(zg.grad[torch.isfinite(z)]).all()


@pytest.mark.parametrize("which", [0, 1])
def test_split_gradients_match_finite_differences_with_the_points_held_fixed(which):
    z, corr = _batch()
    z, corr = z[which], corr[which]
    opts = {"tol": 0.0, "max_samples": 8 * 256, "seed": 4}  # a fixed number of points: smooth in z
    zg = z.clone().requires_grad_()
    mvn_cdf(zg, corr, **opts).backward()
    h = 1e-6
    for j in torch.isfinite(z).nonzero().flatten()[:7].tolist():
        up, down = z.clone(), z.clone()
        up[j] += h
        down[j] -= h
        fd = (mvn_cdf(up, corr, **opts) - mvn_cdf(down, corr, **opts)).item() / (2 * h)
        assert abs(zg.grad[j].item() - fd) <= 1e-5 + 1e-4 * abs(fd), (j, zg.grad[j].item(), fd)
