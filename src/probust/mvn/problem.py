"""The checked, standardised problem that :func:`probust.mvn.mvn_cdf` and :func:`probust.mvn.mvn_sf` start from."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import Tensor

from probust.mvn.checks import check_inputs, check_options

__all__ = ["Problem", "prepare"]


@dataclass(frozen=True)
class Problem:
    """A checked batch of problems about X ~ N(0, cov) and bounds ``upper``, flattened to [n, k]
    and standardised: what :func:`probust.mvn.mvn_cdf` and :func:`probust.mvn.mvn_sf` both start from.

    Attributes:
        upper: float64 [n, k], the bounds as given (+-inf kept).
        z: float64 [n, k], upper_i / sd_i where upper_i is finite, 0 elsewhere (no infinity
            reaches autograd); sd_i is taken as 1 for zero-variance coordinates.
        corr: float64 [n, k, k], the correlation matrix of the symmetrised cov (clamped to
            [-1, 1], 1 on the diagonal).
        frozen: bool [n, k], zero variance: X_i == 0 exactly.
        finite: bool [n, k], upper_i is finite.
        batch_shape: the broadcast batch shape, n = its product.
        tol, max_samples, seed: the checked options.
    """

    upper: Tensor
    z: Tensor
    corr: Tensor
    frozen: Tensor
    finite: Tensor
    batch_shape: torch.Size
    tol: float
    max_samples: int
    seed: int

    @property
    def limits(self) -> Tensor:
        """float64 [n, k] standardised bounds with their meaning kept: +inf never crossed
        (an infinite bound, or X_i == 0 <= upper_i), -inf always crossed."""
        crossed = torch.where(self.upper < 0, -torch.inf, torch.inf)
        return torch.where(self.frozen, crossed, torch.where(self.finite, self.z, self.upper))

    def unflatten(self, values: Tensor) -> Tensor:
        """[n] -> [*batch_shape]."""
        return values.reshape(self.batch_shape)


#: The mvn-cdf's absolute error tolerance by default: :func:`probust.mvn.mvn_cdf`'s, the
#: Taylor/MMSE estimators' and mc_cv / mc_is's ``tol`` and ``probust estimate``'s ``--tol``.
DEFAULT_TOL = 1e-4
#: The most quasi-Monte Carlo points per problem by default (mvn_cdf's and mvn_sf's ``max_samples``).
DEFAULT_MAX_SAMPLES = 200_000


def prepare(
    upper: Tensor, cov: Tensor, *, tol: float = DEFAULT_TOL, max_samples: int = DEFAULT_MAX_SAMPLES, seed: int = 0
) -> Problem:
    """Check the inputs and options (ValueError naming the argument), broadcast, flatten and
    standardise them: the one entry point of every public function over (upper, cov)."""
    upper, cov, batch_shape = check_inputs(upper, cov)
    tol, max_samples, seed = check_options(tol, max_samples, seed)
    k = upper.shape[-1]
    n = math.prod(batch_shape)
    upper, cov = upper.reshape(n, k), cov.reshape(n, k, k)
    cov = 0.5 * (cov + cov.mT)  # symmetric use of both triangles -> a symmetric gradient
    var = cov.diagonal(dim1=-2, dim2=-1)
    frozen = (var <= 0).detach()  # X_i == 0 exactly
    sd = torch.sqrt(torch.where(frozen, 1.0, var))
    finite = torch.isfinite(upper)
    z = torch.where(finite, upper, 0.0) / sd  # infinities kept out of autograd
    corr = (cov / (sd[:, :, None] * sd[:, None, :])).clamp(-1.0, 1.0)
    eye = torch.eye(k, dtype=torch.bool, device=upper.device)
    corr = torch.where(eye, 1.0, corr)
    return Problem(upper, z, corr, frozen, finite, batch_shape, tol, max_samples, seed)
