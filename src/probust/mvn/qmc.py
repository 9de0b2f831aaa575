"""Adaptive randomised quasi-Monte Carlo of Genz's integrand: estimate and error for k_eff >= 3."""

from __future__ import annotations

from typing import cast

import torch
from torch import Tensor

from probust.mvn.bounds import orthant_bounds
from probust.mvn.genz import Factor, FactorTensors, block_sums, factorise
from probust.mvn.numerics import add_rows, ndtr, tree_sum
from probust.mvn.sobol import sobol_points

__all__ = ["qmc_cdf"]

_REPLICATES = 8  # independent scramblings; error = t-quantile x standard error over these
_T_99 = 3.5  # two-sided 99% quantile of Student's t with _REPLICATES - 1 = 7 dof (3.4995)
_FIRST_STAGE = 32  # points per replicate in the first stage; each later stage doubles the total
_SAMPLE_CHUNK = 1024  # points per replicate evaluated together (fixed: fixes the summation order)
_SLAB = 1 << 15  # (problems x samples) per integrand call, at most; it holds K times as many doubles
_SLAB_DOUBLES = 1 << 20  # ... so it shrinks (by halves, to 1 << 13) to keep those within 8 MiB (_slab)
_MIN_STOP = 2 * _FIRST_STAGE  # points per replicate before any problem may stop (see qmc_cdf)
_GUARD = 2.0**-1.5  # a stage's error may not fall below this share of the previous one's (qmc_cdf)
_MIN_FOLDED = 1024  # points per replicate before a problem with folded constraints may stop
_SHARP_SD = 0.1  # conditional sd (correlation units) at or below which a variable is nearly determined
_SPLIT_SHARE = 0.05  # ... and split off where its constraint fails with more than this share of target


def _slab(kk: int) -> int:
    """Problems x samples per integrand call for problems of kk variables.

    The integrand's running sums take (kk - 1) doubles per sample and are swept once per step,
    so they should stay near the cache: the call shrinks from 1 << 15 (by halves, to 1 << 13)
    while (kk - 1) x its size exceeds 2^20 doubles (measurements: docs/mvn.md, "Where the time
    goes at k = 99"). Which problems share a call never changes a problem's value, so this is a
    speed knob only.
    """
    slab = _SLAB
    while slab > 1 << 13 and max(kk - 1, 1) * slab > _SLAB_DOUBLES:
        slab //= 2
    return slab


class _Recomputed(torch.autograd.Function):
    """block_sums that keeps only its inputs and recomputes itself in backward.

    A graph over every sample would hold (steps x samples) intermediates per problem; this
    holds the factors only. The forward runs the in-place kernels, the backward the
    out-of-place ones: the same values.
    """

    @staticmethod
    def forward(ctx, w: Tensor, n_steps: int, *tensors: Tensor) -> Tensor:
        ctx.n_steps = n_steps
        ctx.save_for_backward(w, *tensors)
        with torch.no_grad():
            return block_sums(*cast(FactorTensors, tensors), w, n_steps)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w, *tensors = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
        with torch.enable_grad():
            out = block_sums(*cast(FactorTensors, tuple(inputs)), w, ctx.n_steps)
            # A scalar's backward, not grad_outputs=grad: a tensor grad_outputs makes torch check
            # its shape with torch.fx's symbolic shapes, whose first use imports sympy
            # (probust.linearisation.pull_back does the same for the gradients).
            scalar = (out * grad.to(out.dtype)).sum()
        wanted = [x for x, need in zip(inputs, ctx.needs_input_grad[2:]) if need]
        grads = iter(torch.autograd.grad(scalar, wanted, allow_unused=True))
        return (None, None, *(next(grads) if need else None for need in ctx.needs_input_grad[2:]))


def qmc_cdf(
    z: Tensor,
    corr: Tensor,
    pad: Tensor | None = None,
    *,
    target: Tensor,
    max_samples: int,
    seed: int,
    bounds: tuple[Tensor, Tensor] | None = None,
) -> tuple[Tensor, Tensor]:
    """Adaptive randomised QMC for a group of problems with k_eff >= 3 (also the engine of
    :func:`probust.mvn.mvn_sf`'s orthant terms).

    Args:
        z: [G, K] standardised finite bounds; corr: [G, K, K] correlations; pad: [G, K] padding
            coordinates (see :func:`probust.mvn.genz.factorise`), None: none.
        target: [G] absolute error at which a problem stops.
        max_samples: cap on samples per problem; seed: the randomisation.
        bounds: (lower [G], upper [G]) each probability lies within (:mod:`probust.mvn.bounds`):
            an estimate +- error wholly outside them missed part of its integrand; it may not stop.

    Returns:
        (estimate [G], error [G]), float64. The error is about a 99% bound: 3.5 standard errors
        over 8 independent scramblings (Student's t, 7 degrees of freedom).

    Stage s adds points [n_{s-1}, n_s) of every replicate's scrambled Sobol' sequence
    (n_0 = _FIRST_STAGE, n_s = 2 n_{s-1}); a problem leaves once its error is <= target, or when
    the next stage would pass max_samples. No problem stops before _MIN_STOP points per
    replicate, nor before _MIN_FOLDED when its covariance is singular with folded constraints,
    and a stage's error may not fall below 2^-1.5 of the previous stage's (docs/mvn.md says why).

    A nearly determined variable (conditional sd at its step <= _SHARP_SD) whose constraint
    can fail with probability Phi(-z_j) > _SPLIT_SHARE x target is split off (docs/mvn.md,
    "Nearly singular correlations"): P(A and B_1 ... B_n) = P(A) - sum_r P(A, B_1 ... B_{r-1},
    not B_r), with the split variable a term negates taken first; a negated term is integrated to
    min(Phi(-z_j), target / (n + 1)) and P(A) to the rest of the target. The problem's error is
    then at least its target, since the terms' own nearly determined variables can hide a little
    of their integrands too. A sharp variable too unlikely to fail for a split adds Phi(-z_j) to
    the error instead.
    """
    g, kk = z.shape
    if pad is None:
        pad = torch.zeros(g, kk, dtype=torch.bool, device=z.device)
    fac = factorise(z, corr, pad)
    needs_grad = torch.is_grad_enabled() and (z.requires_grad or corr.requires_grad)
    with torch.no_grad():
        sharp = (fac.cond_sd <= _SHARP_SD) & ~pad
        tails = torch.where(sharp, ndtr(-z.detach()), 0.0)
        split = tails > _SPLIT_SHARE * target.detach()[:, None]
        unseen = tree_sum(torch.where(split, 0.0, tails), -1)
        owners = split.any(-1)
    if not bool(owners.any()):
        est, err = _integrate(fac, target, max_samples, seed, bounds, needs_grad)
        return est, err + unseen
    plain, split_rows = (~owners).nonzero().flatten(), owners.nonzero().flatten()
    est = torch.zeros(g, dtype=torch.float64, device=z.device)
    err = unseen.clone()
    if len(plain):
        sub_bounds = None if bounds is None else (bounds[0][plain], bounds[1][plain])
        e, r = _integrate(fac.select(plain), target[plain], max_samples, seed, sub_bounds, needs_grad)
        est, err = est.index_put((plain,), e), err.index_put((plain,), r, accumulate=True)
    zt, ct, pt, owner, negated = _split_terms(z[split_rows], corr[split_rows], pad[split_rows], split[split_rows])
    owner = split_rows[owner]
    sign = torch.where(negated >= 0, -1.0, 1.0).to(torch.float64)
    with torch.no_grad():
        term_bounds = orthant_bounds(zt.detach(), ct.detach(), pt)
        # A negated term is at most its variable's tail: it gets that much of the target (at
        # most an equal share) and P(A) the rest, which is what decides the sampling.
        n_terms = add_rows(torch.zeros(g, dtype=torch.float64, device=z.device), owner, torch.ones_like(sign))
        share = target.detach()[owner] / n_terms[owner]
        small = torch.minimum(tails[owner, negated.clamp_min(0)], share)
        small = torch.where(negated >= 0, small, 0.0)
        used = add_rows(torch.zeros(g, dtype=torch.float64, device=z.device), owner, small)
        term_target = torch.where(negated >= 0, small, target.detach()[owner] - used[owner])
    e, r = _integrate(factorise(zt, ct, pt), term_target, max_samples, seed, term_bounds, needs_grad)
    est = add_rows(est, owner, sign * e, inplace=False)
    err = add_rows(err, owner, r, inplace=False)
    # The terms have nearly determined variables of their own, whose rare regions their spread
    # cannot see either (docs/mvn.md): a split problem claims no less than its target.
    return est, torch.maximum(err, torch.where(owners, target.detach(), 0.0))


def _split_terms(z: Tensor, corr: Tensor, pad: Tensor, split: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
    """The terms of P(A and B_1 ... B_n) = P(A) - sum_r P(A, B_1 ... B_{r-1}, not B_r).

    Args:
        z: [H, K], corr: [H, K, K], pad: [H, K] problems; split: [H, K] bool, the variables
            B_1 ... B_n to split off (in index order; n >= 1 per problem).

    Returns:
        z', corr', pad' of every term (a dropped variable becomes padding, a negated one has its
        bound and correlations' signs flipped), the problem each term belongs to and the variable
        it negates (long; -1 for P(A), which enters the sum with sign +1, the others with -1):
        problem h's n + 1 terms.
    """
    h, kk = z.shape
    rank = split.long().cumsum(-1) - 1
    n = split.sum(-1)
    eye = torch.eye(kk, dtype=z.dtype, device=z.device)
    zs, cs, ps, owners, negated = [], [], [], [], []
    for r in range(int(n.max()) + 1):
        rows = (n >= r).nonzero().flatten()
        drop = split[rows] & (rank[rows] >= r)
        flip = split[rows] & (rank[rows] == r - 1)
        unit = torch.where(flip, -1.0, 1.0).to(z.dtype)
        dropped = pad[rows] | drop
        pair = dropped[:, :, None] | dropped[:, None, :]
        c = corr[rows] * unit[:, :, None] * unit[:, None, :]
        zs.append(torch.where(dropped, 0.0, z[rows] * unit))
        cs.append(torch.where(pair, eye, c))
        ps.append(dropped)
        owners.append(rows)
        negated.append(torch.where(flip.any(-1), flip.long().argmax(-1), -1))
    return torch.cat(zs), torch.cat(cs), torch.cat(ps), torch.cat(owners), torch.cat(negated)


def _integrate(
    fac: Factor,
    target: Tensor,
    max_samples: int,
    seed: int,
    bounds: tuple[Tensor, Tensor] | None,
    needs_grad: bool,
) -> tuple[Tensor, Tensor]:
    """The staged QMC of :func:`qmc_cdf` for factored problems: (estimate [G], error [G])."""
    g, kk = fac.bs.shape
    device = fac.bs.device
    reps = _REPLICATES
    sums = torch.zeros(g, reps, dtype=torch.float64, device=device)
    count = torch.zeros(g, dtype=torch.float64, device=device)
    err = torch.full((g,), torch.inf, dtype=torch.float64, device=device)
    active = torch.arange(g, device=device)
    per_rep_cap = max(max_samples // reps, 2)
    folded = (fac.fold_step >= 0).any(-1)
    slab = _slab(kk)
    start, stop = 0, min(_FIRST_STAGE, per_rep_cap)
    while len(active) and start < per_rep_cap:
        stop = min(stop, per_rep_cap)
        # Blocks run as many steps as their largest problem needs: group similar sizes. (Which
        # problems share a block does not change any problem's value.)
        active = active[torch.argsort(fac.steps[active], stable=True)]
        new = torch.zeros(len(active), reps, dtype=torch.float64, device=device)
        for lo in range(start, stop, _SAMPLE_CHUNK):
            hi = min(lo + _SAMPLE_CHUNK, stop)
            w = sobol_points(seed, reps, lo, hi, max(kk - 1, 1)).to(device)
            n_pts = max(1, slab // (reps * (hi - lo)))
            parts = []
            for c0 in range(0, len(active), n_pts):
                sub = active[c0 : c0 + n_pts]
                n_steps = int(fac.steps[sub].max())
                args = fac.tensors(sub)
                if needs_grad:
                    parts.append(_Recomputed.apply(w, n_steps, *args))
                else:
                    with torch.no_grad():
                        parts.append(block_sums(*args, w, n_steps))
            new = new + torch.cat(parts)
        sums = sums.index_add(0, active, new)
        count = count.index_fill(0, active, float(stop))
        with torch.no_grad():
            means = sums[active] / stop
            centred = means - tree_sum(means, -1)[:, None] / reps
            e_act = _T_99 * torch.sqrt(tree_sum(centred * centred, -1) / (reps * (reps - 1)))
            prev = err[active]
            e_act = torch.where(torch.isinf(prev), e_act, torch.maximum(e_act, prev * _GUARD))
        err = err.index_copy(0, active, e_act)
        early = (folded[active] & (stop < _MIN_FOLDED)) | (stop < _MIN_STOP)
        if bounds is not None:
            with torch.no_grad():
                scale = fac.const[active].detach()
                estimate = tree_sum(means, -1) / reps * scale
                half = e_act * scale
                early = early | (estimate - half > bounds[1][active]) | (estimate + half < bounds[0][active])
        active = active[(e_act > target[active]) | early]
        start, stop = stop, 2 * stop
    est = tree_sum(sums / count[:, None], -1) / reps * fac.const
    return est, err * fac.const
