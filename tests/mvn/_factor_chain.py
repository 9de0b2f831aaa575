"""An exact oracle of the mvn tests beyond one factor: a factor plus a Gaussian Markov chain.

X_i = lambda_i T + s_i M_i with s_i = sqrt(1 - lambda_i^2), T ~ N(0, 1) and M a stationary Gaussian
Markov chain (M_1 ~ N(0, 1), M_{j+1} = rho_j M_j + sqrt(1 - rho_j^2) E_{j+1}), the coordinates then
listed in a random order. The correlation

    R_ij = lambda_i lambda_j + s_i s_j prod_{l between i and j in chain order} rho_l

is full rank and neither one-factor nor banded (the chain's correlations decay along it, the
factor's do not, signs mix; neighbours in the chain correlate up to about 0.95). Given T = t the event X <= b is M_j <= a_j(t) = (b_j - lambda_j t) / s_j
for every j, a chain event computed by the forward recursion

    f_1 = phi,   f_{j+1}(m') = integral_{-L}^{a_j} f_j(m) phi((m' - rho_j m) / r_j) / r_j dm,
    P(M <= a) = integral_{-L}^{a_k} f_k,

with Gauss-Legendre nodes on each [-L, a_j] (L = 9: the chain's marginals are N(0, 1), so the mass
cut off is ~1e-19), and the outer integral over t by Gauss-Hermite nodes. Every piece is smooth
(kernel widths r_j >= 0.43, factor slopes s_j / lambda_j >= 1), so both rules converge
exponentially. Measured against runs with 400 t-nodes: for |lambda| <= 0.7, 48 nodes of each rule
keep k <= 30 within ~1e-13 and 64 keep k = 99 within ~1e-10 (loadings up to 0.9 would need 100
t-nodes for 1e-12; not used).
test_cdf_tolerance.py checks the oracle against closed forms (independence; a two-step chain is a
bivariate normal), the one-factor quadrature (rho = 0), scipy at tight settings and itself with
twice the nodes: all far below any tolerance tested.
"""

from __future__ import annotations

import math

import numpy as np
import torch
from scipy.special import ndtr, roots_hermitenorm, roots_legendre

_L = 9.0  # the chain's grid starts at -L: its marginals are N(0, 1), P(M_j < -9) ~ 1e-19


def factor_chain_corr(lam: np.ndarray, rho: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The correlation [k, k] of X (coordinate i sits at chain position order[i]); rho [k - 1]."""
    k = len(lam)
    s = np.sqrt(1.0 - lam**2)
    chain = np.eye(k)  # by chain position: corr(M_p, M_q) = rho_p ... rho_{q-1}
    for p in range(k - 1):
        chain[p, p + 1 :] = chain[p + 1 :, p] = np.cumprod(rho[p:])
    r = np.outer(lam, lam) + np.outer(s, s) * chain[np.ix_(order, order)]
    r[np.arange(k), np.arange(k)] = 1.0
    return r


def _chain_cdf(a: np.ndarray, rho: np.ndarray, nodes: int) -> np.ndarray:
    """P(M_j <= a[i, j] for all j) for bound vectors a [m, k] in chain order and chain
    correlations rho [m, k - 1] (one chain per row): [m]. In torch float64, in place, for speed."""
    x01, w01 = (torch.from_numpy(v) for v in roots_legendre(nodes))  # on [-1, 1]
    at = torch.from_numpy(a).clamp(max=_L)
    rt = torch.from_numpy(rho)
    alive = at[:, 0] > -_L
    half = (at[:, 0] + _L).clamp(min=0.0) / 2  # [m]: node n of row i at -L + half_i (x_n + 1)
    grid = -_L + half[:, None] * (x01[None, :] + 1.0)
    weight = half[:, None] * w01[None, :]
    f = torch.exp(-0.5 * grid**2) / math.sqrt(2 * math.pi)  # f_1 at the nodes
    for j in range(1, a.shape[1]):
        rj = rt[:, j - 1, None]
        scale = 1.0 / (torch.sqrt(2.0 * (1.0 - rj) * (1.0 + rj)))  # 1 / (r sqrt 2)
        alive &= at[:, j] > -_L
        half_new = (at[:, j] + _L).clamp(min=0.0) / 2
        new = -_L + half_new[:, None] * (x01[None, :] + 1.0)
        # phi((m' - rho m) / r) / r = exp(-(m' s - rho m s)^2) s / sqrt(pi), s = 1 / (r sqrt 2)
        kernel = (new * scale)[:, :, None] - (grid * (rj * scale))[:, None, :]  # [m, new, old]
        kernel.square_().neg_().exp_()
        f = torch.bmm(kernel, (f * weight * scale / math.sqrt(math.pi))[:, :, None])[:, :, 0]
        grid, weight = new, half_new[:, None] * w01[None, :]
    return torch.where(alive, (f * weight).sum(1), 0.0).numpy()


def batched_factor_chain_cdf(
    b: np.ndarray,
    lam: np.ndarray,
    rho: np.ndarray,
    order: np.ndarray,
    *,
    nodes: int | None = None,
    hermite: int | None = None,
) -> np.ndarray:
    """P(X <= b) for n problems at once: b, lam, order [n, k], rho [n, k - 1] -> [n].

    To ~1e-10 or better for |lambda| <= 0.7, |rho| <= 0.9, k <= 99 with the default nodes of each
    rule (48 up to k = 30, 64 beyond; test_cdf_tolerance.py checks them against twice as many).
    Gauss-Hermite nodes of weight below 1e-18 are left out.
    """
    k = b.shape[1]
    nodes = nodes or (48 if k <= 30 else 64)
    hermite = hermite or (48 if k <= 30 else 64)
    t, w = roots_hermitenorm(hermite)
    w = w / math.sqrt(2 * math.pi)
    t, w = t[w > 1e-18], w[w > 1e-18]
    n, k = b.shape
    out = np.empty(n)
    chunk = max(1, 1024 // len(t))  # rows of [nodes, nodes] kernels held at once
    for s0 in range(0, n, chunk):
        sl = slice(s0, s0 + chunk)
        s = np.sqrt(1.0 - lam[sl] ** 2)
        a = (b[sl, None, :] - lam[sl, None, :] * t[None, :, None]) / s[:, None, :]  # [c, H, k]
        in_chain = np.empty_like(a)
        for i in range(a.shape[0]):
            in_chain[i][:, order[sl][i]] = a[i]
        rows = np.repeat(rho[sl], len(t), axis=0)
        out[sl] = _chain_cdf(in_chain.reshape(-1, k), rows, nodes).reshape(-1, len(t)) @ w
    return out


def factor_chain_cdf(
    b: np.ndarray,
    lam: np.ndarray,
    rho: np.ndarray,
    order: np.ndarray,
    *,
    nodes: int | None = None,
    hermite: int | None = None,
) -> float:
    """P(X <= b) for one problem: b, lam, order [k] (order[i] is coordinate i's chain position),
    rho [k - 1]; see :func:`batched_factor_chain_cdf`."""
    return float(batched_factor_chain_cdf(b[None], lam[None], rho[None], order[None], nodes=nodes, hermite=hermite)[0])


def independent_cdf(b: np.ndarray) -> float:
    """The closed form at lambda = 0, rho = 0 (a check of the oracle)."""
    return float(np.prod(ndtr(b)))


def factor_chain_params(k: int, n: int, seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Random (lam [n, k], rho [n, k - 1], order [n, k]): loadings |lambda| in [0.1, 0.7], chain
    correlations |rho| in [0.2, 0.9] (a third of each negative), a random chain order."""
    rng = np.random.default_rng(seed)
    lam = rng.uniform(0.1, 0.7, (n, k)) * np.where(rng.random((n, k)) < 1 / 3, -1.0, 1.0)
    rho = rng.uniform(0.2, 0.9, (n, k - 1)) * np.where(rng.random((n, k - 1)) < 1 / 3, -1.0, 1.0)
    order = np.argsort(rng.random((n, k)), axis=1)
    return lam, rho, order


def factor_chain_problems(k: int, n: int, p_range: tuple[float, float], seed: int):
    """n problems of dimension k (:func:`factor_chain_params`), bounds c + Exp(1) spread with c
    placing the probability near a target drawn uniformly from p_range (bisection on a coarse
    version of the oracle).

    Returns:
        bounds [n, k], correlations [n, k, k], exact probabilities [n] (float64 numpy).
    """
    lam, rho, order = factor_chain_params(k, n, seed)
    rng = np.random.default_rng(seed + 1)
    spread = rng.exponential(1.0, (n, k))
    target = rng.uniform(*p_range, n)
    lo, hi = np.full(n, -6.0), np.full(n, 8.0)
    for _ in range(6):  # the probability grows with c: bisection to 14 / 2^6 ~ 0.2, near enough
        # 32 nodes of each rule: within ~0.02 of the oracle (24 nodes are off by up to 0.25)
        mid = (lo + hi) / 2
        above = batched_factor_chain_cdf(mid[:, None] + spread, lam, rho, order, nodes=32, hermite=32) > target
        hi, lo = np.where(above, mid, hi), np.where(above, lo, mid)
    b = (lo + hi)[:, None] / 2 + spread
    corr = np.array([factor_chain_corr(*args) for args in zip(lam, rho, order)])
    return b, corr, batched_factor_chain_cdf(b, lam, rho, order)
