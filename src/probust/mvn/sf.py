"""Small failure probabilities with relative accuracy: ``mvn_sf(upper, cov) = 1 - mvn_cdf(upper, cov)``.

When p_robust is close to 1, what matters is p_fail = 1 - p, e.g. 1e-9: ``1 - mvn_cdf`` keeps no
digits of it, since the cdf has an *absolute* tolerance. Here p_fail is a sum of positive terms
(no cancellation), one per boundary, each computed to an absolute tolerance proportional to
p_fail's lower bound; the decomposition and its error budget are in docs/mvn.md.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probust.errors import OptionError
from probust.mvn.numerics import ndtr
from probust.mvn.problem import DEFAULT_MAX_SAMPLES, Problem, prepare
from probust.mvn.qmc import qmc_cdf

__all__ = ["mvn_sf"]

_SKIP_FRACTION = 0.01  # share of the error budget skipped terms may use, at most
# Relative accuracy claimed for the univariate term, erfc(z / sqrt 2) / 2: its exponent -z^2 / 2
# carries float64 rounding, a relative error growing with z^2: below 2e-13 up to z = 37.5 against
# 40-digit mpmath (docs/mvn.md).
_CLOSED_FORM_RTOL = 3e-13
# Below float64's smallest normal number (2.2e-308, z > ~37.5) values are subnormal: spaced 2^-1074
# apart whatever their size, so a relative error bound must include a few of those steps.
_TINY = torch.finfo(torch.float64).tiny
_SUBNORMAL_STEP = 2.0**-1074


def mvn_sf(
    upper: Tensor,
    cov: Tensor,
    *,
    rtol: float = 1e-2,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
    return_error: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """P(X_i > upper_i for at least one i) for X ~ N(0, cov), with relative accuracy, batched.

    Args:
        upper: [..., k] upper limits (as in :func:`probust.mvn.mvn_cdf`); +inf: never crossed,
            -inf: always crossed.
        cov: [..., k, k] symmetric positive semi-definite covariance; batch dims broadcast.
        rtol: target relative error of the result.
        max_samples: cap on the QMC samples of one term (the error reported says if it was hit).
        seed: fixes the QMC randomisation.
        return_error: also return the relative error.

    Returns:
        float64 [...] failure probabilities on ``upper``'s device and, with ``return_error``, a
        float64 [...] relative error bound: the sum of the terms' absolute error bounds (about
        99% each for QMC terms) over the result; 0 where the result is exact (0 or 1). Where the
        probability is below float64's smallest normal number (2.2e-308: the largest tail's z
        beyond ~37.5) the result is subnormal and the bound includes its rounding (one step of
        2^-1074 per term, relative to the result: up to 1 near z = 38.5); where it underflows to
        0 (z beyond ~38.5) the result is 0 with relative error 1. Not differentiable.
    """
    if not (isinstance(rtol, (int, float)) and 0 < rtol < 1):
        raise OptionError(f"must be a number in (0, 1), got {rtol!r}", field="rtol")
    with torch.no_grad():
        problem = prepare(upper, cov, max_samples=max_samples, seed=seed)
        p, err = _sf_flat(problem, rtol)
    p, err = problem.unflatten(p), problem.unflatten(err)
    return (p, err) if return_error else p


def _sf_flat(problem: Problem, rtol: float) -> tuple[Tensor, Tensor]:
    """A prepared problem [n, k] -> (p_fail [n], relative error [n]), float64."""
    max_samples, seed = problem.max_samples, problem.seed
    n, k = problem.upper.shape
    device = problem.upper.device
    if n == 0 or k == 0:
        zeros = torch.zeros(n, dtype=torch.float64, device=device)
        return zeros, zeros.clone()
    z, corr = problem.limits, problem.corr  # z: +inf never crossed, -inf always
    z, order = z.sort(dim=1)  # largest tail first; +inf (never crossed) last
    corr = corr.gather(1, order[:, :, None].expand(-1, -1, k)).gather(2, order[:, None, :].expand(-1, k, -1))
    tails = ndtr(-z)  # [n, k], the bound of each term
    dead = z[:, 0] == -torch.inf  # a boundary that is always crossed
    lower = tails[:, 0]  # p_fail >= the largest single tail
    budget = rtol * lower
    skip = tails <= _SKIP_FRACTION * budget[:, None] / k
    skip[:, 0] = False
    qmc_terms = (~skip[:, 1:]).sum(1).clamp_min(1)
    tol = budget * (1 - _SKIP_FRACTION) / qmc_terms  # absolute tolerance of each QMC term

    terms = torch.zeros(n, k, dtype=torch.float64, device=device)
    errors = torch.zeros(n, k, dtype=torch.float64, device=device)
    terms[:, 0] = tails[:, 0]
    errors[:, 0] = _CLOSED_FORM_RTOL * tails[:, 0]
    for i in range(1, k):
        rows = (~skip[:, i] & torch.isfinite(z[:, i]) & ~dead).nonzero().flatten()
        if len(rows):
            value, error = _orthant_term(z[rows, : i + 1], corr[rows, : i + 1, : i + 1], tol[rows], max_samples, seed)
            terms[rows, i] = value
            errors[rows, i] = error
    skipped = torch.where(skip & torch.isfinite(z), tails, 0.0).sum(1)
    p_fail = terms.sum(1)
    # Subnormal terms are rounded to steps of 2^-1074 (erfc's result, the QMC sums): an absolute
    # error that 1e-13 x value underflows to nothing.
    subnormal = ((terms > 0) & (terms < _TINY)).sum(1).to(torch.float64)
    abs_error = errors.sum(1) + skipped + subnormal * _SUBNORMAL_STEP
    p_fail = torch.where(dead, 1.0, p_fail)
    exact = dead | (z[:, 0] == torch.inf)  # 1, or no boundary can be crossed: 0
    underflow = (p_fail == 0) & ~exact
    rel = torch.where(p_fail > 0, abs_error / torch.where(p_fail > 0, p_fail, 1.0), 0.0)
    rel = torch.where(exact, 0.0, torch.where(underflow, 1.0, rel.clamp(max=1.0)))
    return p_fail.clamp(0.0, 1.0), rel


def _orthant_term(z: Tensor, corr: Tensor, tol: Tensor, max_samples: int, seed: int) -> tuple[Tensor, Tensor]:
    """P(Y_j <= z_j for j < m, Y_m > z_m) for Y ~ N(0, corr), m = the last index: (value, abs error).

    The sign of Y_m is flipped, making it an orthant probability, integrated by the adaptive QMC
    (:func:`probust.mvn.qmc.qmc_cdf`) with a per-problem absolute tolerance ``tol`` [G].
    """
    sign = torch.ones(z.shape[1], dtype=torch.float64, device=z.device)
    sign[-1] = -1.0
    return qmc_cdf(z * sign, corr * sign[:, None] * sign[None, :], target=tol, max_samples=max_samples, seed=seed)
