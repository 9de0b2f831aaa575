"""From a linearisation (margins c, normals u) to a probability: the mvn-cdf and mv-sigmoid maps.

With Q = u S u^T (S the noise covariance), the boundary i is crossed when
u_i . eps < -c_i, and u_i . eps ~ N(0, Q_ii). Standardising gives
z_i = c_i / sqrt(Q_ii) and the correlation R = Q / sqrt(diag Q diag Q^T), so

    mvn-cdf:    p = P(Y_i <= z_i for all i != t),  Y ~ N(0, R)
    mv-sigmoid: p = 1 / (1 + sum_i exp(-z_i))

and their complements p_fail = 1 - p, computed directly with relative accuracy.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from probust.linearisation import other_classes
from probust.mvn import mvn_cdf, mvn_sf
from probust.noise import Noise


@dataclass
class Standardised:
    """z [B, C] (+inf at the target), z_others [B, C-1], corr [B, C-1, C-1] (float64), and
    scale [B, C], the standard deviation sqrt(u_i S u_i^T) of u_i . eps (0 where the noise cannot
    move the boundary; None once problems are stacked)."""

    z: Tensor
    z_others: Tensor
    corr: Tensor
    scale: Tensor | None = None


def standardise(margin: Tensor, u: Tensor, target: Tensor, noise: Noise) -> Standardised:
    """Boundary distances in noise units and the boundaries' correlation.

    Args:
        margin: [B, C] margins c_i (any value at the target).
        u: [B, C, *S] boundary normals (zero at the target).
        target: long [B].
        noise: supplies the quadratic form u S u^T.

    A boundary with zero variance (u_i S u_i^T == 0) cannot be moved by the noise: it is
    never crossed when c_i > 0 (z_i = +inf, it drops out of the CDF) and always when
    c_i <= 0 (z_i = -inf, p = 0).
    """
    q = noise.quadratic_form(u)  # [B, C, C] float64
    var = q.diagonal(dim1=1, dim2=2)
    frozen = var <= 0
    # The square root is taken on the safe side of the where: sqrt'(0) = inf would turn the
    # where's zero gradient into NaN (the target's row is always frozen).
    scale = torch.where(frozen, 1.0, var).sqrt()
    c = margin.to(torch.float64)
    z = torch.where(frozen, torch.where(c > 0, torch.inf, -torch.inf), c / scale)
    z = z.scatter(1, target[:, None], torch.inf)
    others = other_classes(target, margin.shape[1])
    z_others = z.gather(1, others)
    inv = torch.where(frozen, 0.0, 1.0 / scale)
    corr = q * inv[:, :, None] * inv[:, None, :]
    eye = torch.eye(corr.shape[-1], dtype=corr.dtype, device=corr.device)
    corr = torch.where(eye.bool(), 1.0, corr.clamp(-1.0, 1.0))
    rows = others[:, :, None].expand(-1, -1, margin.shape[1])
    corr = corr.gather(1, rows).gather(2, others[:, None, :].expand(-1, others.shape[1], -1))
    return Standardised(z=z, z_others=z_others, corr=corr, scale=torch.where(frozen, 0.0, scale))


def stack(parts: list[Standardised]) -> Standardised:
    """The problems of several :class:`Standardised` of different widths as one, padded with
    z = +inf and uncorrelated unit variables (boundaries that cannot be crossed: the mvn-cdf drops
    them, and a problem's value does not depend on them)."""
    if len(parts) == 1:
        return parts[0]
    width = max(part.z.shape[1] for part in parts)

    def pad(z: Tensor, to: int) -> Tensor:
        return torch.cat([z, z.new_full((z.shape[0], to - z.shape[1]), torch.inf)], dim=1)

    corrs = []
    for part in parts:
        b, k = part.corr.shape[:2]
        corr = torch.eye(width - 1, dtype=part.corr.dtype, device=part.corr.device).repeat(b, 1, 1)
        corr[:, :k, :k] = part.corr
        corrs.append(corr)
    return Standardised(
        z=torch.cat([pad(part.z, width) for part in parts]),
        z_others=torch.cat([pad(part.z_others, width - 1) for part in parts]),
        corr=torch.cat(corrs),
    )


def mv_sigmoid(z_others: Tensor) -> Tensor:
    """1 / (1 + sum_i exp(-z_i)) over the last dimension, computed stably: float64 [...]."""
    return torch.sigmoid(-torch.logsumexp(-z_others.to(torch.float64), dim=-1))


def mvn_probability(std: Standardised, *, tol: float, seed: int) -> tuple[Tensor, Tensor]:
    """P(Y <= z) for Y ~ N(0, corr): (p [B], absolute error estimate [B]), float64."""
    p, error = mvn_cdf(std.z_others, std.corr, tol=tol, seed=seed, return_error=True)
    return p, error


def mv_sigmoid_fail(z_others: Tensor) -> Tensor:
    """1 - mv_sigmoid(z) = s / (1 + s), s = sum_i exp(-z_i), with relative accuracy: float64 [...]."""
    return torch.sigmoid(torch.logsumexp(-z_others.to(torch.float64), dim=-1))


def mvn_fail_probability(std: Standardised, *, rtol: float, seed: int) -> tuple[Tensor, Tensor]:
    """P(Y_i > z_i for some i), Y ~ N(0, corr): (p_fail [B], relative error [B]), float64."""
    p_fail, error = mvn_sf(std.z_others.detach(), std.corr.detach(), rtol=rtol, seed=seed, return_error=True)
    return p_fail, error
