"""Monte Carlo with the linearised model as a control variate (method ``"mc_cv"``).

p_cv = mean(Y) - beta * (mean(X) - mu), where Y_j says the model kept its prediction on draw j,
X_j that the linearised model (Taylor or MMSE margins and normals) kept it on the same draw, and
mu = E[X] is the linearisation's exact p_robust (the mvn-cdf). Unbiased up to O(1/n) and the
mvn-cdf's error, with a valid interval, and far fewer model evaluations where the linearisation
is good. The Monte Carlo draws are those of :class:`probust.MonteCarlo` with the same seed, so
``r.p_mc`` equals plain Monte Carlo's ``p``. Requires Gaussian noise. The derivation, the
interval and its small-sample floor: ``docs/estimators.md``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
from scipy import special
from torch import Tensor, nn

from probust._checks import check_positive_float, check_positive_int
from probust._progress import Progress
from probust._user_model import finite_rows, to_format, weights_in_format
from probust.estimators import maps
from probust.estimators.base import check_noisy_copies, plan_blocks
from probust.estimators.linearised_mc import LinearisedMonteCarlo, project
from probust.estimators.monte_carlo import DEFAULT_DRAWS
from probust.estimators.result import Estimate
from probust.estimators.trust import upper_rate
from probust.noise import STREAM_MC, Noise, point_keys


@dataclass
class CVStatistics:
    """The control-variate estimate from sufficient statistics (all float64 [B])."""

    p: Tensor
    stderr: Tensor
    low: Tensor
    high: Tensor
    beta: Tensor
    p_mc: Tensor

    @property
    def half_width(self) -> Tensor:
        return (self.high - self.low) / 2


def cv_statistics(
    n: Tensor, sy: Tensor, sx: Tensor, sxy: Tensor, mu: Tensor, mu_error: Tensor, confidence: float
) -> CVStatistics:
    """Regression estimator and its interval from counts over n draws.

    Args:
        n: int64 [B] draws per point (>= 1).
        sy: int64 [B] draws the model kept the target (sum of Y).
        sx: int64 [B] draws the linearised model kept it (sum of X).
        sxy: int64 [B] draws both kept it (sum of X * Y).
        mu: float64 [B] E[X], the linearised model's exact p_robust.
        mu_error: float64 [B] absolute error bound of ``mu`` (the mvn-cdf's).
        confidence: level of the interval.

    Returns:
        :class:`CVStatistics`; ``p``, ``low`` and ``high`` are clipped to [0, 1].
    """
    nf, syf, sxf, sxyf = (t.to(torch.float64) for t in (n, sy, sx, sxy))
    x_varies = (sx > 0) & (sx < n)
    # Centred sums from integer counts: exact numerators, no cancellation of large squares.
    sxx = sxf * (nf - sxf) / nf
    syy = syf * (nf - syf) / nf
    sxy_c = (sxyf * nf - sxf * syf) / nf
    beta = torch.where(x_varies, sxy_c / torch.where(x_varies, sxx, 1.0), 1.0)
    p_mc = syf / nf
    p = p_mc - beta * (sxf / nf - mu)
    sse = (syy - 2 * beta * sxy_c + beta * beta * sxx).clamp_min(0.0)
    dof = torch.where(x_varies, nf - 2, nf - 1).clamp_min(1.0)
    disagree = (sy + sx - 2 * sxy).to(torch.float64)
    alpha = 1.0 - confidence
    q_up = upper_rate(disagree, nf, 1.0 - alpha / 2)
    s2 = torch.maximum(sse / dof, q_up - disagree / nf)
    stderr = torch.sqrt(s2 / nf)
    half = float(special.ndtri(1.0 - alpha / 2)) * stderr + beta.abs() * mu_error
    return CVStatistics(
        p=p.clamp(0.0, 1.0),
        stderr=stderr,
        low=(p - half).clamp(0.0, 1.0),
        high=(p + half).clamp(0.0, 1.0),
        beta=beta,
        p_mc=p_mc,
    )


class MonteCarloCV(LinearisedMonteCarlo):
    """Monte Carlo with the linearised model as a control variate: unbiased, with a valid
    interval, and far fewer model evaluations where the linearisation is good.

    Args:
        model, seed, execution: see :class:`probust.estimators.LinearisedMonteCarlo`.
        sigma: noise standard deviation per input coordinate (units of x), or a Gaussian
            :class:`probust.noise.Noise`.
        n_samples: Monte Carlo draws per point (the most, in adaptive mode).
        linearisation: "mmse" (default; margins and gradients averaged over ``mmse_samples``
            noisy copies) or "taylor" (at x). Its cost is not counted in ``r.n_samples``:
            Taylor adds one forward and C backward passes, MMSE ``mmse_samples`` times that.
        mmse_samples: N, copies of the MMSE linearisation.
        confidence: level of the interval (``ci_low``, ``ci_high``).
        target_half_width: adaptive mode: stop a point once its half-width is at most this
            (checked every ``check_every`` draws). None: always ``n_samples`` draws.
        check_every: draws between adaptive checks (fixed, so results do not depend on batching).
        tol: absolute tolerance of the mvn-cdf giving the control variate's mean; its error
            bound (times |beta|) is added to the interval.

    Returns (from ``__call__``) an :class:`~probust.Estimate` with ``p``, ``stderr``,
    ``ci_low``/``ci_high``, ``n_samples`` (model evaluations on noisy copies), ``p_mc`` (plain
    Monte Carlo on the same draws), ``p_linearised`` (mu), ``cv_beta``, ``z``, ``cdf_error``.
    """

    method = "mc_cv"

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        n_samples: int = DEFAULT_DRAWS,
        *,
        target_half_width: float | None = None,
        check_every: int = 500,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, sigma, n_samples, **kwargs)
        self.target_half_width = (
            None if target_half_width is None else check_positive_float(target_half_width, "target_half_width")
        )
        self.check_every = check_positive_int(check_every, "check_every")

    def _estimate_chunk(self, x: Tensor, target: Tensor | None, indices: Tensor, bar: Progress) -> Estimate:
        target, c, u = self.linear.linearise(x, target, indices)
        std = maps.standardise(c, u, target, self.noise)
        mu, mu_error = maps.mvn_probability(std, tol=self.linear.tol, seed=self.seed)
        keys = point_keys(self.seed, indices, STREAM_MC)
        # The target's margin is 0 by construction; it must never count as a crossing.
        c_keep = c.scatter(1, target[:, None], torch.inf)
        batch = x.shape[0]
        counts = torch.zeros(4, batch, dtype=torch.int64, device=x.device)  # n, sy, sx, sxy
        active = torch.ones(batch, dtype=torch.bool, device=x.device)
        step = self.n_samples if self.target_half_width is None else self.check_every
        start = 0
        with torch.no_grad():
            while start < self.n_samples and active.any():
                n = min(step, self.n_samples - start)
                rows = active.nonzero().flatten()
                counts[:, rows] += self._count(
                    x[rows], target[rows], c_keep[rows], u[rows], keys[rows], indices[rows], start, n, bar
                )
                start += n
                if self.target_half_width is not None:
                    s = cv_statistics(counts[0], counts[1], counts[2], counts[3], mu, mu_error, self.confidence)
                    active &= s.half_width > self.target_half_width
        bar.update(int((self.n_samples - counts[0]).sum()))  # points that stopped early
        s = cv_statistics(counts[0], counts[1], counts[2], counts[3], mu, mu_error, self.confidence)
        return Estimate(
            p=s.p,
            target=target,
            method=self.method,
            stderr=s.stderr,
            ci_low=s.low,
            ci_high=s.high,
            n_samples=counts[0].clone(),
            margin=c,
            grad_norm=u.flatten(2).norm(dim=2),
            z=std.z,
            cdf_error=mu_error,
            p_mc=s.p_mc,
            p_linearised=mu,
            cv_beta=s.beta,
        )

    def _count(
        self,
        x: Tensor,
        target: Tensor,
        c: Tensor,
        u: Tensor,
        keys: Tensor,
        indices: Tensor,
        start: int,
        n: int,
        bar: Progress,
    ) -> Tensor:
        """Counts (n, sum Y, sum X, sum XY) over draws start..start+n-1: int64 [4, B].

        Raises ValueError (naming the points) if any draw gave NaN or inf logits."""
        shape = x.shape[1:]
        out = torch.zeros(4, x.shape[0], dtype=torch.int64, device=x.device)
        nonfinite = torch.zeros(x.shape[0], dtype=torch.int64, device=x.device)
        plan = self._forward_plan(x)
        with weights_in_format(self.model, plan.channels_last):
            for points, first, count in plan_blocks(x.shape[0], n, plan.rows):
                eps = self.noise.sample(keys[points], start + first, count, shape)
                logits = self.model(to_format((x[points, None] + eps).view(-1, *shape), plan.channels_last))
                finite = finite_rows(logits, count)
                y = (logits.argmax(dim=1).view(-1, count) == target[points, None]) & finite
                nonfinite[points] += count - finite.sum(1)
                linear = c[points, None, :] + project(u[points], eps)
                xk = (linear > 0).all(dim=2)
                out[0, points] += count
                out[1, points] += y.sum(1)
                out[2, points] += xk.sum(1)
                out[3, points] += (y & xk).sum(1)
                bar.update(y.numel())
        check_noisy_copies(self.noise, nonfinite, n, indices)
        return out
