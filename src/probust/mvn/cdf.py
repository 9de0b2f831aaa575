"""Batched, differentiable multivariate normal CDF in torch: :func:`mvn_cdf`.

``mvn_cdf(upper, cov)`` is P(X_1 <= upper_1, ..., X_k <= upper_k) for a zero-mean Gaussian
X ~ N(0, cov), for a whole batch of (upper, cov) pairs at once: the probability map of the
``taylor`` and ``mmse`` estimators (paper, section 3).

Per point: coordinates that cannot matter are removed (+inf bounds, zero variances and, where
>= 3 coordinates are constrained, tails negligible against ``tol``, whose cost is added to the
error); k_eff <= 2 left -> closed forms (:mod:`probust.mvn.bivariate`); k_eff >= 3 -> first
deterministic bounds from the one- and two-dimensional marginals (:mod:`probust.mvn.bounds`):
where they pin p to within the tolerance their midpoint is the estimate, with a guaranteed
error; otherwise Genz's transform (:mod:`probust.mvn.genz`) integrated by adaptive randomised
QMC (:mod:`probust.mvn.qmc`), which may not stop while its estimate contradicts the bounds and
is finally clipped to them. Nearly determined variables that can still fail (nearly singular
correlations) are split off into a difference of orthant probabilities first, whose thin
failure regions plain QMC points would miss. docs/mvn.md derives each step.

The QMC points and their randomisation depend only on ``seed``, never on the batch, and only
elementwise arithmetic and sums in a fixed order touch a point's numbers (no BLAS), so a point's
value is bitwise the same whatever else is in the batch, and with or without autograd.
Gradients flow to ``upper`` and ``cov`` through autograd with the QMC points held fixed.
"""

from __future__ import annotations

import torch
from torch import Tensor

from probust.mvn.bivariate import BVN_ERROR, bvn_cdf
from probust.mvn.bounds import orthant_bounds
from probust.mvn.numerics import ndtr
from probust.mvn.problem import DEFAULT_MAX_SAMPLES, DEFAULT_TOL, Problem, prepare
from probust.mvn.qmc import qmc_cdf

__all__ = ["mvn_cdf"]

_DROP_FRACTION = 0.05  # share of tol that dropped negligible coordinates may cost, at most


def mvn_cdf(
    upper: Tensor,
    cov: Tensor,
    *,
    tol: float = DEFAULT_TOL,
    max_samples: int = DEFAULT_MAX_SAMPLES,
    seed: int = 0,
    return_error: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """P(X_1 <= upper_1, ..., X_k <= upper_k) for X ~ N(0, cov), batched.

    Args:
        upper: [..., k] upper integration limits of a zero-mean Gaussian; +inf leaves a
            coordinate unconstrained (its row of ``cov`` is then ignored), -inf makes the
            probability 0. Any real dtype.
        cov: [..., k, k] symmetric positive semi-definite covariance; singular is fine, and a
            zero variance makes X_i == 0 exactly. Batch dims broadcast against ``upper``'s.
        tol: absolute error at which a point stops sampling (k_eff >= 3 only; 0 = never, i.e.
            spend ``max_samples``, which makes the estimate a smooth function of the inputs). A
            point that stops on ``tol`` (returned error <= tol) is within tol with about 99%
            confidence. A point that reaches ``max_samples`` first returns an error above tol and
            may be off by more than tol: with the default cap, this is common for probabilities
            far from 0 and 1 at k_eff >= 60 with tol 1e-4, and at k_eff >= 9 with tol 1e-5
            (measured in docs/mvn.md); raise ``max_samples`` where tol must hold.
        max_samples: cap on the QMC samples spent on one point (in 8 replicates of
            ``max_samples // 8``, at least 2 each).
        seed: fixes the randomisation. It is the same for every point, and a point's value does
            not depend on the rest of the batch (bitwise), nor on whether autograd is on.
        return_error: also return the error estimate.

    Returns:
        float64 [...] probabilities on ``upper``'s device, and with ``return_error`` a float64
        [...] absolute error estimate: about a 99% bound on |estimate - truth| (3.5 standard
        errors over 8 independent randomisations, plus the bound on what dropped coordinates
        can cost), also where ``max_samples`` stopped the point; ~0 (<= 1e-14) where at most 2
        dimensions are left; a guaranteed bound where the deterministic bounds of
        :mod:`probust.mvn.bounds` pinned the point (no sampling), and never above their width; at
        least ``tol`` (less what dropped coordinates take of it) where nearly determined
        variables were split off (docs/mvn.md, "Nearly singular correlations"). Over many
        independent problems, at most 1% of points (up to binomial noise) have
        |estimate - truth| above it: tests/mvn/test_cdf_tolerance.py checks this against exact
        references at k = 3 to 99, and docs/mvn.md gives the measured shares.

    Raises:
        ValueError: NaN, wrong or mismatched shapes, a non-symmetric or clearly non-PSD ``cov``
            (a negative eigenvalue beyond rounding), or bad options; the message names the
            argument.

    Gradients with respect to ``upper`` and ``cov`` are those of the QMC estimate with its
    points held fixed (exact for k_eff <= 2); the variable ordering and the number of samples a
    point used are discrete choices made without gradient.

    Speed and accuracy against scipy's per-point integrator: docs/mvn.md
    (``python benchmarks/bench_mvn.py``).
    """
    problem = prepare(upper, cov, tol=tol, max_samples=max_samples, seed=seed)
    p, err = _mvn_cdf_flat(problem)
    p, err = problem.unflatten(p), problem.unflatten(err)
    return (p, err) if return_error else p


def _sampled(
    z: Tensor, corr: Tensor, keep: Tensor, order: Tensor, kmax: int, target: Tensor, max_samples: int, seed: int
) -> tuple[Tensor, Tensor]:
    """(p, err) [m] of problems with three or more kept coordinates (``keep`` [m, k], their
    columns first in ``order``): the orthant bounds' midpoint where they pin p within ``target``
    (the error left after the dropped tails, which are a deterministic part of it), else QMC
    between the bounds."""
    cols = order[:, :kmax]
    pad = ~keep.gather(1, cols)
    zs = torch.where(pad, 0.0, z.gather(1, cols))
    cs = corr.gather(1, cols[:, :, None].expand(-1, -1, z.shape[1]))
    cs = cs.gather(2, cols[:, None, :].expand(-1, kmax, -1))
    pad2 = pad[:, :, None] | pad[:, None, :]
    cs = torch.where(pad2, torch.eye(kmax, dtype=torch.float64, device=z.device), cs)
    lower, upper = orthant_bounds(zs, cs, pad)
    # Where the bounds alone pin p to within target (p near 1, few interacting boundaries),
    # their midpoint is the estimate, with a guaranteed error: no sampling.
    settled = ((upper - lower) / 2 <= target).detach()
    val = (lower + upper) / 2
    e = ((upper - lower) / 2).detach()
    sample = (~settled).nonzero().flatten()
    if len(sample):
        lo, hi = lower[sample], upper[sample]
        drawn, drawn_e = qmc_cdf(
            zs[sample],
            cs[sample],
            pad[sample],
            target=target[sample],
            max_samples=max_samples,
            seed=seed,
            bounds=(lo.detach(), hi.detach()),
        )
        # The truth lies within the bounds: an estimate outside them moves onto them, and
        # its error is at most their width.
        clipped = torch.minimum(torch.maximum(drawn, lo), hi)
        moved = (clipped - drawn).abs().detach()
        val = val.index_put((sample,), clipped)
        e = e.index_put((sample,), torch.minimum(drawn_e + moved, (hi - lo).detach()))
    return val, e


def _mvn_cdf_flat(problem: Problem) -> tuple[Tensor, Tensor]:
    """A prepared problem [n, k] -> (p [n], err [n]), float64."""
    upper, z, corr, frozen, finite = problem.upper, problem.z, problem.corr, problem.frozen, problem.finite
    tol, max_samples, seed = problem.tol, problem.max_samples, problem.seed
    n, k = upper.shape
    device = upper.device
    p = torch.ones(n, dtype=torch.float64, device=device)
    err = torch.zeros(n, dtype=torch.float64, device=device)
    if n == 0 or k == 0:
        return p, err

    with torch.no_grad():
        dead = (upper == -torch.inf) | (frozen & (upper < 0))
        dead = dead.any(-1)
        tail = torch.where(finite & ~frozen, ndtr(-z), 0.0)
        # Negligible tails are dropped only where that saves sampling (>= 3 constrained
        # coordinates); the budget is shared by the constrained coordinates alone, so adding
        # +inf bounds changes nothing.
        constrained = (finite & ~frozen).sum(-1, keepdim=True)
        drop_eps = torch.where(constrained >= 3, tol * _DROP_FRACTION / constrained.clamp_min(1), 0.0)
        drop = frozen | (upper == torch.inf) | (tail < drop_eps)
        bias = torch.where(drop, tail, 0.0).sum(-1)
        keep = ~drop & ~dead[:, None]
        k_eff = keep.sum(-1)

    # Kept coordinates first, in their original order: the small cases read them off the front.
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)
    for size in (1, 2):
        idx = (k_eff == size).nonzero().flatten()
        if len(idx):
            cols = order[idx, :size]
            zs = z[idx].gather(1, cols)
            if size == 1:
                val = ndtr(zs[:, 0])
                e = torch.zeros_like(val)
            else:
                rho = corr[idx, cols[:, 0], cols[:, 1]]
                val = bvn_cdf(zs[:, 0], zs[:, 1], rho)
                e = torch.full_like(val, BVN_ERROR)
            p = p.index_copy(0, idx, val)
            err = err.index_copy(0, idx, e.detach())
    idx = (k_eff >= 3).nonzero().flatten()
    if len(idx):
        target = (tol - bias[idx]).clamp_min(0.0)
        val, e = _sampled(z[idx], corr[idx], keep[idx], order[idx], int(k_eff[idx].max()), target, max_samples, seed)
        p = p.index_copy(0, idx, val)
        err = err.index_copy(0, idx, e)
    # The dropped constraints B remove mass P(A) - P(A and B) in [0, bias]: centre the estimate.
    p = torch.where(dead, 0.0, (p - 0.5 * bias).clamp(0.0, 1.0))
    err = torch.where(dead, 0.0, err + bias)
    return p, err.detach()
