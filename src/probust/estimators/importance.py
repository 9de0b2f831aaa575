"""Importance-sampling Monte Carlo for small failure probabilities (method ``"mc_is"``).

Draws come from a mixture of the nominal Gaussian noise (share ``defensive``) and Gaussians
centred on the most likely crossing point of each linearised decision boundary, and are
reweighted by the density ratio, so p_fail = 1 - p_robust stays unbiased for any model, with a
relative error far below plain Monte Carlo's when p_fail is small. Requires Gaussian noise. The
proposal, the weights and the interval (CLT from ``MIN_FAILURES`` failures on, a conservative
count-based bound below): ``docs/estimators.md``.
"""

from __future__ import annotations

import math
from typing import Any, cast

import torch
from scipy import special
from torch import Tensor, nn

from probust._checks import check_fraction, check_positive_int
from probust._progress import Progress
from probust._user_model import finite_rows, to_format, weights_in_format
from probust.estimators import maps
from probust.estimators.base import check_noisy_copies, plan_blocks
from probust.estimators.linearised_mc import LinearisedMonteCarlo, project
from probust.estimators.monte_carlo import DEFAULT_DRAWS
from probust.estimators.result import Estimate
from probust.estimators.trust import upper_rate
from probust.noise import STREAM_CONTROL, Gaussian, Noise, point_keys, uniform_draws

# Derived from the reserved control stream so the two draws of a sample (which component,
# and the Gaussian around it) are independent of each other and of every other estimator's.
_STREAM_NOISE = STREAM_CONTROL
_STREAM_COMPONENT = (STREAM_CONTROL << 8) | 1


def covariance_times(noise: Gaussian, u: Tensor) -> Tensor:
    """S u for boundary normals u [B, C, *S] under Gaussian noise N(0, S): same shape, u's dtype."""
    if noise.sigma is not None:
        return noise.sigma**2 * u
    if noise.std is not None:
        return u * noise.std.to(u.device, u.dtype) ** 2
    assert noise.cov is not None  # a Gaussian has one of sigma, std, cov
    flat = u.flatten(2).to(torch.float64) @ noise.cov.to(u.device)
    return flat.to(u.dtype).view_as(u)


class MonteCarloIS(LinearisedMonteCarlo):
    """p_fail (and p = 1 - p_fail) by importance sampling around the linearised boundaries.

    Args:
        model, seed, execution: see :class:`probust.Estimator`.
        sigma: noise standard deviation per input coordinate, or a Gaussian Noise.
        n_samples: draws per point.
        linearisation: "mmse" (default, as :class:`probust.MonteCarloCV`; margins and
            gradients averaged over ``mmse_samples`` noisy copies) or "taylor" (at x): where
            the proposal's components sit. Its cost is not counted in ``r.n_samples``.
        mmse_samples: N, copies of the MMSE linearisation.
        components: keep only this many most likely boundaries (by Phi(-z_i)); None: all.
        defensive: share ``a`` of the draws from the nominal noise (0 <= a < 1).
        confidence: level of the interval.
        tol: the linearisation's mvn-cdf tolerance.

    Returns (from ``__call__``) an :class:`~probust.Estimate` with ``p = 1 - p_fail``,
    ``p_fail``, ``p_fail_error`` (standard error / p_fail; inf when no failure was drawn),
    ``stderr``, ``ci_low``/``ci_high`` (for p: the CLT interval from ``MIN_FAILURES`` failures
    on, below that the conservative count-based bound of docs/estimators.md, valid and finite also with
    no failure), ``n_samples``, ``z``.
    """

    method = "mc_is"
    #: Failures needed for the CLT interval; below it the count-based bound (docs/estimators.md).
    MIN_FAILURES = 10

    def __init__(
        self,
        model: nn.Module,
        sigma: float | Tensor | Noise,
        n_samples: int = DEFAULT_DRAWS,
        *,
        components: int | None = None,
        defensive: float = 0.1,
        **kwargs: Any,
    ) -> None:
        super().__init__(model, sigma, n_samples, **kwargs)
        self.components = None if components is None else check_positive_int(components, "components")
        self.defensive = check_fraction(defensive, "defensive", closed_below=True)

    def _proposal(self, target: Tensor, c: Tensor, u: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """Mixture log-weights [B, 1 + C] (nominal first), shifts delta [B, C, *S], the
        coefficients (c_i / q_i [B, C], z_i^2 / 2 [B, C]) of the density ratio (float64), and z."""
        q = self.noise.quadratic_form(u).diagonal(dim1=1, dim2=2)
        std = maps.standardise(c, u, target, self.noise)
        usable = torch.isfinite(std.z)  # not the target, not a boundary the noise cannot move
        safe_q = torch.where(usable, q, 1.0)
        ratio = torch.where(usable, c.to(torch.float64) / safe_q, 0.0)
        half_z2 = torch.where(usable, std.z, 0.0) ** 2 / 2
        log_pi = torch.where(usable, torch.special.log_ndtr(-std.z), -torch.inf)
        if self.components is not None and self.components < log_pi.shape[1]:
            kth = log_pi.topk(self.components, dim=1).values[:, -1:]
            log_pi = torch.where(log_pi >= kth, log_pi, -torch.inf)
        any_boundary = torch.isfinite(log_pi).any(1, keepdim=True)
        log_pi = torch.where(any_boundary, log_pi - torch.logsumexp(log_pi, 1, keepdim=True), -torch.inf)
        # No movable boundary: all draws nominal (the estimate is then plain Monte Carlo).
        share = torch.where(any_boundary, self.defensive, 1.0)
        log_mix = torch.cat([share.log(), (1 - share).log() + log_pi], dim=1)
        delta = -(ratio[:, :, None].to(u.dtype) * covariance_times(cast(Gaussian, self.noise), u).flatten(2)).view_as(u)
        return log_mix, delta, ratio, half_z2, std.z

    def _estimate_chunk(self, x: Tensor, target: Tensor | None, indices: Tensor, bar: Progress) -> Estimate:
        target, c, u = self.linear.linearise(x, target, indices)
        log_mix, delta, ratio, half_z2, z = self._proposal(target, c, u)
        noise_keys = point_keys(self.seed, indices, _STREAM_NOISE)
        component_keys = point_keys(self.seed, indices, _STREAM_COMPONENT)
        shape = x.shape[1:]
        batch = x.shape[0]
        sum_w = torch.zeros(batch, dtype=torch.float64, device=x.device)
        sum_w2 = torch.zeros_like(sum_w)
        failures = torch.zeros(batch, dtype=torch.int64, device=x.device)
        nonfinite = torch.zeros_like(failures)
        cumulative = log_mix.exp().cumsum(1)
        plan = self._forward_plan(x)
        with torch.no_grad(), weights_in_format(self.model, plan.channels_last):
            for points, first, count in plan_blocks(batch, self.n_samples, plan.rows):
                pick = uniform_draws(component_keys[points], first, count, 1, torch.float64)[..., 0]
                which = torch.searchsorted(cumulative[points], pick.contiguous(), right=True)
                which = which.clamp_max(cumulative.shape[1] - 1)  # rounding of the last cumsum
                shift = torch.cat([torch.zeros_like(delta[points, :1]), delta[points]], dim=1)
                eps = self.noise.sample(noise_keys[points], first, count, shape)
                eps = eps + shift.gather(1, which.view(*which.shape, *([1] * len(shape))).expand(-1, -1, *shape))
                logits = self.model(to_format((x[points, None] + eps).view(-1, *shape), plan.channels_last))
                finite = finite_rows(logits, count)
                fail = (logits.argmax(dim=1).view(-1, count) != target[points, None]) & finite
                nonfinite[points] += count - finite.sum(1)
                proj = project(u[points], eps).to(torch.float64)  # [P, n, C]
                exponent = -ratio[points, None, :] * proj - half_z2[points, None, :]
                log_g = torch.logsumexp(
                    torch.cat(
                        [log_mix[points, None, :1].expand(-1, count, -1), log_mix[points, None, 1:] + exponent], 2
                    ),
                    dim=2,
                )
                w = torch.where(fail, torch.exp(-log_g), 0.0)
                sum_w[points] += w.sum(1)
                sum_w2[points] += (w * w).sum(1)
                failures[points] += fail.sum(1)
                bar.update(fail.numel())
        check_noisy_copies(self.noise, nonfinite, self.n_samples, indices)
        n = float(self.n_samples)
        p_fail = sum_w / n
        var = ((sum_w2 / n - p_fail**2) * n / max(n - 1, 1)).clamp_min(0.0)
        stderr = torch.sqrt(var / n)
        half = float(special.ndtri(1 - (1 - self.confidence) / 2)) * stderr
        fail_low, fail_high = p_fail - half, p_fail + half
        few = failures < self.MIN_FAILURES
        if few.any():
            # Every weight is at most 1 / (the nominal share): log_mix[:, 0] is its log.
            w_max = torch.exp(-log_mix[:, 0])
            bound = w_max * upper_rate(failures, float(self.n_samples), self.confidence)
            fail_low = torch.where(few, 0.0, fail_low)
            fail_high = torch.where(few, bound, fail_high)
        rel = torch.where(p_fail > 0, stderr / torch.where(p_fail > 0, p_fail, 1.0), math.inf)
        p = (1 - p_fail).clamp(0.0, 1.0)
        return Estimate(
            p=p,
            target=target,
            method=self.method,
            stderr=stderr,
            ci_low=(1 - fail_high).clamp(0.0, 1.0),
            ci_high=(1 - fail_low).clamp(0.0, 1.0),
            n_samples=torch.full((batch,), self.n_samples, dtype=torch.int64, device=x.device),
            z=z,
            p_fail=p_fail,
            p_fail_error=rel,
        )
