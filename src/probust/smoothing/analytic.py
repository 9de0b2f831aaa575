"""Radius *estimates* from the analytic estimators: sigma * Phi^-1(p), no guarantee attached.

Cohen et al.'s radius sigma * Phi^-1(p_A) turns the probability p_A that noisy copies keep a
class into the L2 radius within which the smoothed classifier keeps it. Taylor and MMSE give p
analytically, in one or a few forward and backward passes instead of 100,000 forward passes,
so the same formula gives a cheap estimate of the smoothed classifier's radius. It is an
estimate, not a certificate: p is not a lower confidence bound, and the linearisation's error
is not bounded, so the true radius may be smaller (or larger).
"""

from __future__ import annotations

import torch
from torch import Tensor

from probust.estimators import Estimate
from probust.noise import Noise
from probust.smoothing.smoothed import isotropic_sigma


def radius_estimate(estimate: Estimate, sigma: float | Tensor | Noise) -> Tensor:
    """An estimate (NOT a certificate) of each point's smoothed-classifier radius: sigma * Phi^-1(p).

    Args:
        estimate: an :class:`probust.Estimate` of p_robust under isotropic Gaussian noise, from
            Taylor or MMSE (any method that estimates the probability under the noise is
            accepted, e.g. Monte Carlo; "softmax" is refused: its p is no such probability). Its
            class is ``estimate.target``, the clean prediction by default, where CERTIFY's class
            comes from noisy draws; where p > 1/2 the two agree.
        sigma: the standard deviation per input coordinate the estimate was computed with, in
            the units of x (a number or an isotropic :class:`probust.Gaussian`).

    Returns:
        float64 [B] on the estimate's device, in the units of x (L2 norm): sigma * Phi^-1(p)
        where p > 1/2, computed from ``estimate.p_fail`` where the estimate has it (accurate when
        p is within 1e-16 of 1); 0 where p <= 1/2 (the formula then gives no radius); +inf
        where the estimate is p = 1 exactly (no boundary the estimate can see).
    """
    if not isinstance(estimate, Estimate):
        raise ValueError(f"estimate must be a probust.Estimate, got {type(estimate).__name__}")
    if estimate.method == "softmax":
        raise ValueError(
            "estimate must come from a method that estimates p under the noise (taylor, mmse, ...), got a softmax "
            "Estimate: its p is the model's confidence, not a probability under noise, and gives no radius"
        )
    scale = isotropic_sigma(sigma)
    p = estimate.p.to(torch.float64)
    z = torch.special.ndtri(p)
    if estimate.p_fail is not None:
        # Phi^-1(p) = -Phi^-1(1 - p): from the failure probability, which keeps its digits near p = 1.
        z = torch.where(p > 0.5, -torch.special.ndtri(estimate.p_fail.to(torch.float64)), z)
    return torch.where(p > 0.5, scale * z, 0.0)
