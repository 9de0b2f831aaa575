"""Differentiable p_robust: the mvn-cdf's gradient, Taylor/MMSE with differentiable=True (RobustLoss: tests/training/test_robust_loss.py).

Oracles: central finite differences (directional derivatives in float64) and, for the mvn-cdf,
the analytic identities dPhi_R(z)/dz_i = phi(z_i) P(Y_-i <= z_-i | Y_i = z_i) and Plackett's
dPhi_R(z)/drho_ij = phi_2(z_i, z_j; rho_ij) P(Y_rest <= z_rest | Y_i = z_i, Y_j = z_j), evaluated
with scipy.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy import stats
from torch import nn

import probust

F64 = torch.float64


def _correlation(k: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    a = torch.randn(k, k, generator=gen, dtype=F64)
    cov = a @ a.T + 0.5 * torch.eye(k, dtype=F64)
    d = cov.diagonal().sqrt()
    return cov / d[:, None] / d[None, :]


# A fixed QMC rule: tol = 0 runs every stage up to max_samples, so the estimate is a smooth,
# deterministic function of its inputs and finite differences apply.
FIXED = dict(tol=0.0, max_samples=16_384, seed=0)


@pytest.mark.parametrize("k", [1, 2, 4])
def test_mvn_cdf_gradient_matches_finite_differences(k):
    gen = torch.Generator().manual_seed(k)
    upper = (torch.randn(k, generator=gen, dtype=F64) * 0.7 + 0.3).requires_grad_(True)
    cov = (_correlation(k, k) * 1.3).requires_grad_(True)
    p = probust.mvn_cdf(upper, cov, **FIXED)
    g_upper, g_cov = torch.autograd.grad(p, (upper, cov))
    du = torch.randn(k, generator=gen, dtype=F64)
    dc = torch.randn(k, k, generator=gen, dtype=F64) * 0.1
    dc = (dc + dc.T) / 2  # stay symmetric (and PSD for a small step)
    h = 1e-5
    with torch.no_grad():
        f = lambda s: probust.mvn_cdf(upper + s * du, cov + s * dc, **FIXED).item()  # noqa: E731
        numeric = (f(h) - f(-h)) / (2 * h)
    analytic = (g_upper * du).sum().item() + (g_cov * dc).sum().item()
    assert analytic == pytest.approx(numeric, rel=1e-5, abs=1e-9)


def test_mvn_cdf_gradient_matches_the_conditional_probability_identities():
    k = 3
    corr = _correlation(k, 7).requires_grad_(True)
    z = torch.tensor([0.3, 1.0, -0.2], dtype=F64, requires_grad=True)
    p = probust.mvn_cdf(z, corr, tol=1e-6)
    gz, gc = torch.autograd.grad(p, (z, corr))
    zz, r = z.detach().numpy(), corr.detach().numpy()
    for i in range(k):
        o = [j for j in range(k) if j != i]
        cond = stats.multivariate_normal(mean=r[o, i] * zz[i], cov=r[np.ix_(o, o)] - np.outer(r[o, i], r[o, i]))
        assert gz[i].item() == pytest.approx(stats.norm.pdf(zz[i]) * cond.cdf(zz[o]), abs=2e-5)
    for i, j in ((0, 1), (0, 2), (1, 2)):
        (rest,) = [m for m in range(k) if m not in (i, j)]
        pair = [i, j]
        s = r[np.ix_(pair, pair)]
        b = r[rest, pair]
        mean = b @ np.linalg.solve(s, zz[pair])
        var = 1 - b @ np.linalg.solve(s, b)
        expected = stats.multivariate_normal(cov=s).pdf(zz[pair]) * stats.norm.cdf((zz[rest] - mean) / math.sqrt(var))
        # the gradient of a symmetric matrix entry is shared between (i, j) and (j, i)
        assert (gc[i, j] + gc[j, i]).item() == pytest.approx(expected, abs=2e-5)


# ---- Taylor and MMSE --------------------------------------------------------------------------


def _mlp(classes: int, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, classes)).double()


def _directional_check(model: nn.Module, x: torch.Tensor, build, h: float = 1e-6, rel: float = 1e-4) -> None:
    """d/ds sum p(params + s v, x + s w) at 0: autograd against central differences."""
    params = list(model.parameters())
    x = x.clone().requires_grad_(True)
    r = build(model)(x)
    assert r.p.requires_grad
    grads = torch.autograd.grad(r.p.sum(), params + [x])
    assert all(torch.isfinite(g).all() for g in grads)
    gen = torch.Generator().manual_seed(1)
    v = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in params]
    w = torch.randn(x.shape, generator=gen, dtype=x.dtype)
    analytic = sum((g * d).sum() for g, d in zip(grads, v + [w])).item()

    def f(s: float) -> float:
        with torch.no_grad():
            for p, d in zip(params, v):
                p.add_(s * d)
            try:
                return build(model)(x.detach() + s * w).p.sum().item()
            finally:
                for p, d in zip(params, v):
                    p.sub_(s * d)

    numeric = (f(h) - f(-h)) / (2 * h)
    assert analytic == pytest.approx(numeric, rel=rel, abs=1e-8), (analytic, numeric)


@pytest.mark.parametrize(
    "classes, cdf",
    [(2, "mvn"), (3, "mvn"), (4, "mvn"), (5, "mv-sigmoid")],
    ids=["binary-closed-form", "bivariate", "qmc-k3", "mv-sigmoid"],
)
def test_taylor_gradient_in_parameters_and_input_matches_finite_differences(classes, cdf):
    model = _mlp(classes, seed=classes)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(0), dtype=F64) * 0.5
    # tol = 1e-15 is never met: the QMC runs its full fixed rule, a smooth function of its inputs
    tol = 1e-15 if cdf == "mvn" else 1e-4
    _directional_check(model, x, lambda m: probust.Taylor(m, 0.4, cdf=cdf, differentiable=True, tol=tol))


def test_mmse_gradient_matches_finite_differences_with_the_noise_held_fixed():
    model = _mlp(4, seed=2)
    x = torch.randn(2, 6, generator=torch.Generator().manual_seed(3), dtype=F64) * 0.5
    _directional_check(model, x, lambda m: probust.MMSE(m, 0.4, n_samples=4, cdf="mv-sigmoid", differentiable=True))


def test_default_path_is_detached_and_unchanged():
    model = _mlp(4, seed=1)
    x = torch.randn(3, 6, dtype=F64, requires_grad=True)
    plain = probust.Taylor(model, 0.4)(x)
    graph = probust.Taylor(model, 0.4, differentiable=True)(x)
    assert not plain.p.requires_grad and not plain.z.requires_grad
    torch.testing.assert_close(graph.p.detach(), plain.p, rtol=0, atol=1e-12)


def test_gradient_is_finite_with_a_boundary_the_noise_cannot_move():
    model = nn.Linear(5, 3).double()
    with torch.no_grad():  # class 2 = class 0 minus a constant: its margin has zero gradient
        model.weight[2] = model.weight[0]
        model.bias[2] = model.bias[0] - 1.0
    x = torch.randn(4, 5, dtype=F64) * 0.1
    for cdf in ("mvn", "mv-sigmoid"):
        r = probust.Taylor(model, 0.2, cdf=cdf, differentiable=True)(x, torch.zeros(4, dtype=torch.long))
        grads = torch.autograd.grad(r.p.sum(), list(model.parameters()))
        assert all(torch.isfinite(g).all() for g in grads)
