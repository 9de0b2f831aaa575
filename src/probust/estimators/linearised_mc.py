"""What the Monte Carlo variants around a linearisation (mc_cv, mc_is) share.

Both take the margins and normals of a Taylor or MMSE linearisation of each point
(:meth:`probust.estimators.linearised.Linearised.linearise`) and spend ``n_samples`` noisy
model evaluations per point; they differ in how the draws are made and weighed.
"""

from __future__ import annotations

import dataclasses
from abc import abstractmethod
from typing import Any

import torch
from torch import Tensor, nn

from probust._checks import check_choice, check_fraction, check_positive_int
from probust._progress import Progress, progress
from probust.estimators.base import Estimator
from probust.estimators.linearised import Linearised
from probust.estimators.mmse import DEFAULT_COPIES, MMSE
from probust.estimators.monte_carlo import DEFAULT_CONFIDENCE, DEFAULT_DRAWS
from probust.estimators.result import Estimate
from probust.estimators.taylor import Taylor
from probust.mvn import DEFAULT_TOL
from probust.noise import Noise, as_noise, require_gaussian

LINEARISATIONS = ("taylor", "mmse")


def linearised_estimator(
    outer: Estimator,
    model: nn.Module,
    noise: Noise,
    linearisation: str,
    *,
    mmse_samples: int,
    **kwargs: Any,
) -> Linearised:
    """The Taylor or MMSE estimator that gives a Monte Carlo variant its linearisation.

    Args:
        outer: the Monte Carlo estimator; its seed and its execution (memory budget, memory
            format, Jacobian strategy, class chunks) are the linearisation's too, except the rows
            per pass: the outer's bound its noisy copies, the linearisation's Jacobian rows are
            measured within the budget.
        model: the classifier.
        noise: the (Gaussian) noise the linearisation is taken under.
        linearisation: "taylor" (at x) or "mmse" (averaged over ``mmse_samples`` noisy copies).
        mmse_samples: N, copies of the MMSE linearisation.
        **kwargs: passed to the estimator (tol, ...).
    """
    check_choice(linearisation, LINEARISATIONS, "linearisation")
    common = dict(execution=outer.execution.replace(batch_size=None), seed=outer.seed, **kwargs)
    if linearisation == "taylor":
        return Taylor(model, noise, **common)
    return MMSE(model, noise, n_samples=mmse_samples, **common)


class LinearisedMonteCarlo(Estimator):
    """Base of the Monte Carlo estimators that draw around a linearisation of each point.

    Args:
        model, seed, execution: see
            :class:`probust.Estimator`; the execution's ``batch_size`` bounds the noisy copies per
            forward pass, its ``jacobian`` and ``class_chunk_size`` the linearisation's backward
            passes.
        sigma: noise standard deviation per input coordinate (units of x), or a Gaussian
            :class:`probust.noise.Noise`.
        n_samples: Monte Carlo draws per point (the most, in adaptive mode).
        linearisation: "mmse" (default; margins and gradients averaged over ``mmse_samples``
            noisy copies) or "taylor" (at x). Its cost is not counted in ``r.n_samples``.
        mmse_samples: N, copies of the MMSE linearisation.
        confidence: level of the interval (``ci_low``, ``ci_high``).
        tol: absolute tolerance of the linearisation's mvn-cdf.
    """

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        n_samples: int = DEFAULT_DRAWS,
        *,
        linearisation: str = "mmse",
        mmse_samples: int = DEFAULT_COPIES,
        confidence: float = DEFAULT_CONFIDENCE,
        tol: float = DEFAULT_TOL,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, **kwargs)
        self.noise = as_noise(sigma)
        require_gaussian(self.noise, self.method)
        self.n_samples = check_positive_int(n_samples, "n_samples")
        self.confidence = check_fraction(confidence, "confidence")
        self.linearisation = linearisation
        self.linear = linearised_estimator(
            self,
            model,
            self.noise,
            linearisation,
            mmse_samples=mmse_samples,
            tol=tol,
        )

    def _estimate(self, x: Tensor, target: Tensor | None, indices: Tensor) -> Estimate:
        self.noise.check_shape(x.shape[1:])
        parts = []
        chunk = self.linear.points_per_chunk(x)
        with progress(x.shape[0] * self.n_samples, self.method, self.show_progress, unit="draw") as bar:
            for first in range(0, x.shape[0], chunk):
                rows = slice(first, min(first + chunk, x.shape[0]))
                chunk_target = None if target is None else target[rows]
                parts.append(self._estimate_chunk(x[rows], chunk_target, indices[rows], bar))
        return dataclasses.replace(Estimate.cat(parts), confidence=self.confidence)

    @abstractmethod
    def _estimate_chunk(self, x: Tensor, target: Tensor | None, indices: Tensor, bar: Progress) -> Estimate:
        """The estimate of one chunk of points (as many as the linearisation holds at once)."""


def project(u: Tensor, eps: Tensor) -> Tensor:
    """u_i . eps_j for every boundary and noise draw: u [B, C, *S], eps [B, n, *S] -> [B, n, C].

    With margins c [B, C] this evaluates the linearised model c + u . eps at every draw: one
    batched matrix product, far cheaper than a forward pass.
    """
    return torch.bmm(eps.flatten(2).to(u.dtype), u.flatten(2).transpose(1, 2))
