"""Genz's separation-of-variables transform of a normal orthant probability, for k_eff >= 3.

Genz-Bretz variable reordering and a pivoted Cholesky factor turn a problem (standardised bounds
z, correlations corr) into the :class:`Factor` of an integrand on the unit cube whose mean is the
probability; :func:`block_sums` evaluates it at quasi-random points. Exactly dependent variables
(singular covariance) become bounds on earlier ones. Only elementwise operations and sums in a
fixed order touch a problem's numbers, so its values do not depend on the other problems in a
block.
"""

from __future__ import annotations

import math
from typing import cast

import torch
from torch import Tensor

from probust.mvn.numerics import tree_sum

__all__ = ["Factor", "FactorTensors", "block_sums", "factorise"]

# A Factor's per-problem fields in the order block_sums takes them: bs, lts, offset, fold_step, fold_upper.
FactorTensors = tuple[Tensor, Tensor, Tensor, Tensor, Tensor]

_DET_VAR = 1e-10  # conditional variance (correlation units) below which a variable is determined
_COEF_EPS = 1e-10  # |Cholesky coefficient| below which it is rounding noise
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT1_2 = math.sqrt(0.5)


def _truncated_mean(b: Tensor) -> Tensor:
    """E[Y | Y <= b] for Y ~ N(0, 1) = -phi(b)/Phi(b), stable for all b (erfcx avoids 0/0)."""
    return -_SQRT_2_OVER_PI / torch.special.erfcx(-b / math.sqrt(2.0))


def _genz_bretz_cholesky(b: Tensor, corr: Tensor, pad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Genz-Bretz reordering with a pivoted Cholesky factor, per point (no autograd).

    At each step the variable with the smallest expected conditional probability
    Phi((b_j - E[mean]) / sd_j) is taken next, so the integrand's small factors come first.
    A variable whose conditional variance is ~0 is an exact linear function of the variables
    taken so far; it is never a pivot while others remain and gets a zero column. Right-looking
    (Schur complement updated by one rank-1 elementwise op per step): no BLAS, whose rounding
    could depend on the batch.

    Args:
        b: [G, K] standardised upper bounds (0 on padding).
        corr: [G, K, K] correlation matrices (identity rows on padding).
        pad: [G, K] bool, slots that belong to no variable.

    Returns:
        perm [G, K] long: variable taken at each step (random ones, then determined, then padding).
        chol [G, K, K]: lower-triangular factor in that order (zero columns at non-random steps).
        random [G, K] bool: steps whose variable has conditional variance > 0.
    """
    g, kk = b.shape
    ar = torch.arange(g, device=b.device)
    schur = corr.clone()
    cols = torch.zeros(g, kk, kk, dtype=b.dtype, device=b.device)  # [point, variable, step]
    mean = torch.zeros(g, kk, dtype=b.dtype, device=b.device)
    done = torch.zeros(g, kk, dtype=torch.bool, device=b.device)
    perm = torch.zeros(g, kk, dtype=torch.long, device=b.device)
    random = torch.zeros(g, kk, dtype=torch.bool, device=b.device)
    inf = torch.tensor(torch.inf, dtype=b.dtype, device=b.device)
    # Padding must come last: the integrand runs a block only for its largest problem's number of
    # variables, so a determined variable placed after padding would be cut off in blocks of
    # smaller problems and kept in blocks of larger ones (a value depending on the batch).
    not_random = torch.full_like(b, 1e300).masked_fill(pad, 1e301)
    for i in range(kk):
        var = schur.diagonal(dim1=1, dim2=2)
        bp = (b - mean) / torch.sqrt(var.clamp_min(_DET_VAR))
        cand = ~done & ~pad & (var > _DET_VAR)
        # Preference: random variables by bound, then determined ones, then padding.
        rank = torch.where(done, inf, not_random)
        piv = torch.where(cand, bp, rank).argmin(-1)  # first minimum on ties: deterministic
        is_rand = cand[ar, piv]
        sp = torch.sqrt(var[ar, piv].clamp_min(0.0))
        col = schur[ar, :, piv] / torch.where(is_rand, sp, 1.0)[:, None]
        col = torch.where(is_rand[:, None] & ~done, col, 0.0)
        col[ar, piv] = torch.where(is_rand, sp, 0.0)
        schur.addcmul_(col[:, :, None], col[:, None, :], value=-1.0)
        cols[:, :, i] = col
        mean += col * torch.where(is_rand, _truncated_mean(bp[ar, piv]), 0.0)[:, None]
        done[ar, piv] = True
        perm[:, i] = piv
        random[:, i] = is_rand
    chol = cols.gather(1, perm[:, :, None].expand(g, kk, kk))
    return perm, chol, random


class _FixedCholesky(torch.autograd.Function):
    """Returns a precomputed Cholesky factor L' of ``mat`` + (a detached correction), with the
    gradient of the Cholesky decomposition (Murray, 2016) flowing back to ``mat``.

    L' is the pivoted factor with ones on the diagonal of non-random steps: it factors the matrix
    whose block of determined variables has been made [coefficients x coefficients^T + I]. That
    block carries no information for a singular covariance, so replacing it loses no gradient.
    """

    @staticmethod
    def forward(mat: Tensor, chol: Tensor) -> Tensor:
        return chol.clone()

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(output)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, None]:
        (chol,) = ctx.saved_tensors
        phi = (chol.mT @ grad).tril()
        phi = 0.5 * (phi + phi.tril(-1).mT)
        g = torch.linalg.solve_triangular(chol.mT, phi, upper=True, left=True)
        g = torch.linalg.solve_triangular(chol, g, upper=False, left=False)
        return g, None


_FIELDS = ("bs", "lts", "offset", "fold_step", "fold_upper")


class Factor:
    """A group's problems in pivot order, in the form the integrand uses.

    Step i's factor is P(constraint i | earlier steps) = erfc(a_i) / 2 with
    a_i = bs_i - mu_i + offset_i and mu_i = sum_{m < i} lts[m, i] y_m: the bound and the
    Cholesky coefficients are pre-multiplied by the row's scale -1 / (sqrt(2) L_ii), and
    lts[m, i] also by sqrt(2) because y_m is kept as Phi^{-1}(.) / sqrt(2) (what erfinv returns).
    Non-random steps have offset -inf (factor 1) and zero columns. A determined variable j
    (singular covariance) is instead scaled by -1 / (sqrt(2) c_j), c_j its coefficient on the
    last random step it depends on (fold_step; -1: none), where it becomes an upper bound on
    y if c_j > 0 (fold_upper) and a lower bound otherwise.

    Fields (all [G, K] but lts [G, K, K]) plus const [G] (indicator factors of determined
    variables that depend on nothing), steps [G] (a problem's effective dimension) and cond_sd
    [G, K] (no autograd): each variable's conditional sd at its step, in the input's order, in
    correlation units (+inf for determined variables and padding).
    """

    def __init__(self, bs, lts, offset, fold_step, fold_upper, const, steps, cond_sd) -> None:
        self.bs, self.lts, self.offset = bs, lts, offset
        self.fold_step, self.fold_upper = fold_step, fold_upper
        self.const, self.steps, self.cond_sd = const, steps, cond_sd

    def tensors(self, idx: Tensor) -> FactorTensors:
        return cast(FactorTensors, tuple(getattr(self, name)[idx] for name in _FIELDS))

    def select(self, idx: Tensor) -> Factor:
        """The problems ``idx`` alone (every field indexed along its first dim)."""
        return Factor(*self.tensors(idx), self.const[idx], self.steps[idx], self.cond_sd[idx])


def factorise(z: Tensor, corr: Tensor, pad: Tensor) -> Factor:
    """Reorder and factor a group of problems into the form the integrand uses.

    Args:
        z: [G, K] standardised finite upper bounds (0 on padding).
        corr: [G, K, K] correlation matrices (identity rows and columns on padding).
        pad: [G, K] bool, slots that belong to no variable (so problems of different sizes can
            share a block).

    Returns:
        The :class:`Factor`. Its float fields carry gradients to ``z`` and ``corr``; the
        variable ordering and the factorisation's discrete choices are made without gradient.
    """
    g, kk = z.shape
    with torch.no_grad():
        perm, chol, random = _genz_bretz_cholesky(z.detach(), corr.detach(), pad)
        chol_fixed = chol + torch.diag_embed((~random).to(chol.dtype))
        padded = pad.gather(1, perm)
        det = ~random & ~padded
        big = (chol.abs() > _COEF_EPS) & random[:, None, :] & det[:, :, None]
        step_idx = torch.arange(kk, device=z.device).expand(g, kk, kk)
        last = torch.where(big, step_idx, -1).amax(-1)
        fold_step = torch.where(det, last, -1)
        folds = fold_step >= 0
        steps = (~padded).sum(-1)
        sd_steps = torch.where(random, chol.diagonal(dim1=1, dim2=2), torch.inf)
        cond_sd = torch.empty_like(sd_steps).scatter_(1, perm, sd_steps)
    if corr.requires_grad:
        pc = perm[:, :, None].expand(g, kk, kk)
        mat = corr.gather(1, pc).gather(2, perm[:, None, :].expand(g, kk, kk))
        chol_fixed = _FixedCholesky.apply(mat, chol_fixed)
    b = z.gather(1, perm)
    coef = chol_fixed.gather(2, fold_step.clamp_min(0)[:, :, None]).squeeze(-1)
    pivot = torch.where(random, chol_fixed.diagonal(dim1=1, dim2=2), torch.where(folds, coef, 1.0))
    row_scale = torch.where(random | folds, -_SQRT1_2 / pivot, 0.0)
    bs = b * row_scale
    lts = torch.where(random[:, :, None], chol_fixed.mT * math.sqrt(2.0), 0.0) * row_scale[:, None, :]
    offset = torch.where(random, 0.0, -torch.inf)
    with torch.no_grad():
        const = torch.where(det & ~folds & (b < 0), 0.0, 1.0).prod(-1)
        fold_upper = folds & (coef > 0)
    return Factor(bs, lts, offset, fold_step, fold_upper, const, steps, cond_sd)


_P_TAIL = 1e-6  # below this, erfinv(2p - 1) loses relative accuracy in p: use ndtri instead
_BELOW_ONE = 1.0 - 2.0**-53
_RESCALE_EVERY = 256  # steps between exact rescalings of the running product by 2^-256


def _genz_integrand(bs, lts, offset, fold_step, fold_upper, w: Tensor, n_steps: int) -> Tensor:
    """Genz's separation-of-variables integrand at QMC points w.

    Args:
        bs, offset, fold_step, fold_upper: [G, K]; lts: [G, K, K] (see Factor).
        w: [>= n_steps - 1, S] points in [0, 1] (coordinate-major), shared by all G problems.
        n_steps: steps to run (the largest effective dimension among the G problems).

    Returns:
        f [G, S] with E f = the probability. Only elementwise ops touch [G, S], so a problem's
        values do not depend on the other problems in the block; steps beyond a problem's
        dimension multiply it by exactly 1. Without autograd the same kernels run in place on
        preallocated buffers (no allocation per step), giving bitwise the same values.
    """
    g, s = bs.shape[0], w.shape[1]
    inplace = not torch.is_grad_enabled()
    # mu[j - 1] accumulates sum_{m < i} lts[m, j] y_m for each variable j still to come. In
    # place: one buffer, row j - 1 for variable j. With autograd: a copy losing a row per step.
    mu = torch.zeros(max(n_steps - 1, 0), g, s, dtype=bs.dtype, device=bs.device)
    fold_steps = set(fold_step[fold_step >= 0].tolist())
    offset_steps = set(torch.isinf(offset[:, :n_steps]).any(0).nonzero().flatten().tolist())
    f: Tensor | None = None
    for i in range(n_steps):
        if i == 0:
            arg = bs[:, :1]
        else:
            arg = torch.sub(bs[:, i : i + 1], mu[i - 1 if inplace else 0])
            if not inplace:
                mu = mu[1:]
        later = mu[i:] if inplace else mu  # variables i + 1, ..., n_steps - 1
        if i in offset_steps:
            arg = arg.add_(offset[:, i : i + 1]) if inplace and i else arg + offset[:, i : i + 1]
        base = None
        if i in fold_steps and i + 1 < n_steps:
            rest = slice(i + 1, n_steps)
            member = (fold_step[:, rest] == i).mT[:, :, None]  # [rest, G, 1]
            upper = fold_upper[:, rest].mT[:, :, None]
            t = bs[:, rest].mT[:, :, None] - later
            arg = torch.maximum(arg, torch.where(member & upper, t, -torch.inf).amax(0))
            base = torch.erfc(torch.where(member & ~upper, t, torch.inf).amin(0))
        ec = arg.erfc_() if inplace and i and base is None else torch.erfc(arg)  # 2 P(step i | earlier)
        if base is not None:
            ec = (ec - base).clamp_min(0.0)
        if f is None:
            f = ec.expand(g, s).clone()
        else:
            f = f.mul_(ec) if inplace else f * ec
        if (i + 1) % _RESCALE_EVERY == 0:
            f = f * 2.0**-_RESCALE_EVERY
        if i + 1 < n_steps:
            q = w[i] * ec if base is None else base + w[i] * ec
            y = _half_ndtri(q, inplace, base is not None)
            col = lts[:, i, i + 1 : n_steps].mT[:, :, None]
            if inplace:
                later.addcmul_(col, y)
            else:
                mu = torch.addcmul(mu, col, y)
    assert f is not None  # n_steps >= 1
    return (f * 2.0 ** -(n_steps % _RESCALE_EVERY)).expand(g, s)


def _half_ndtri(q: Tensor, inplace: bool, may_reach_two: bool) -> Tensor:
    """Phi^{-1}(q / 2) / sqrt(2) for q in [0, 2]: erfinv (fast, vectorised), ndtri in the far
    lower tail. In place, q is overwritten; the values are the same either way.

    q = w * erfc(.) < 2 always (w < 1); only a folded lower bound can round q up to 2.
    """
    tail = None
    if q.min() < 2.0 * _P_TAIL:
        tail = (q < 2.0 * _P_TAIL).nonzero(as_tuple=True)
        fix = torch.special.ndtri((q[tail] * 0.5).clamp_min(torch.finfo(q.dtype).tiny)) * _SQRT1_2
    if inplace:
        x = q.sub_(1.0)  # -1 only in the tail, which is replaced
        y = (x.clamp_(max=_BELOW_ONE) if may_reach_two else x).erfinv_()
        if tail is not None:
            y[tail] = fix
        return y
    # Clamping both ends keeps erfinv's derivative finite where the tail replaces the value.
    y = torch.erfinv((q - 1.0).clamp(-_BELOW_ONE, _BELOW_ONE))
    return y if tail is None else y.index_put(tail, fix)


def block_sums(
    bs: Tensor, lts: Tensor, offset: Tensor, fold_step: Tensor, fold_upper: Tensor, w: Tensor, n_steps: int
) -> Tensor:
    """Integrand summed over each replicate's points, in a fixed (pairwise) order.

    Args:
        bs, lts, offset, fold_step, fold_upper: a :class:`Factor`'s fields (``Factor.tensors``).
        w: [D, R, m] points in (0, 1) (:func:`probust.mvn.sobol.sobol_points`), D >= n_steps - 1.
        n_steps: the largest effective dimension among the G problems.

    Returns:
        [G, R]: for each problem and replicate, the sum of the integrand over the m points.
    """
    _, r, m = w.shape
    f = _genz_integrand(bs, lts, offset, fold_step, fold_upper, w.reshape(w.shape[0], r * m), n_steps)
    return tree_sum(f.reshape(-1, r, m), -1)
