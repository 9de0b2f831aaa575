"""Binomial confidence intervals for Monte Carlo counts."""

from __future__ import annotations

import torch
from scipy import special, stats
from torch import Tensor

from probust.errors import OptionError

INTERVALS = ("wilson", "clopper-pearson")


def binomial_interval(successes: Tensor, trials: Tensor, confidence: float, method: str) -> tuple[Tensor, Tensor]:
    """Two-sided interval for a binomial proportion.

    Args:
        successes, trials: int [B] counts (trials >= 1).
        confidence: e.g. 0.95.
        method: "wilson" (score interval) or "clopper-pearson" (exact, conservative).

    Returns:
        (low, high) float64 [B] on the counts' device; low is exactly 0 where k = 0 and high
        exactly 1 where k = n (both methods), so the interval always holds k / n.
    """
    k = successes.double().cpu()
    n = trials.double().cpu()
    alpha = 1.0 - confidence
    if method == "wilson":
        zq = float(special.ndtri(1.0 - alpha / 2))
        p = k / n
        denom = 1 + zq**2 / n
        centre = (p + zq**2 / (2 * n)) / denom
        half = zq * torch.sqrt(p * (1 - p) / n + zq**2 / (4 * n**2)) / denom
        low, high = (centre - half).clamp(0, 1), (centre + half).clamp(0, 1)
        # The score interval's ends at k = 0 and k = n are exactly 0 and 1; in floats centre - half
        # is ~1e-18 and centre + half 1 - 1.1e-16, which would exclude the estimate p = 0 or 1.
        low = torch.where(k == 0, 0.0, low)
        high = torch.where(k == n, 1.0, high)
    elif method == "clopper-pearson":
        kn, nn = k.numpy(), n.numpy()
        low = torch.from_numpy(stats.beta.ppf(alpha / 2, kn, nn - kn + 1))
        high = torch.from_numpy(stats.beta.ppf(1 - alpha / 2, kn + 1, nn - kn))
        low = torch.where(k == 0, 0.0, low)
        high = torch.where(k == n, 1.0, high)
    else:
        raise OptionError(f"must be one of {INTERVALS}, got {method!r}", field="interval")
    return low.to(successes.device), high.to(successes.device)


def upper_rate(k: Tensor, n: Tensor | float, level: float) -> Tensor:
    """One-sided Clopper-Pearson upper bound of a binomial rate from k successes in n trials.

    Args:
        k: counts [B] (any numeric dtype).
        n: trials, [B] or a scalar (>= 1).
        level: e.g. 0.975: P(rate <= bound) >= level.

    Returns:
        float64 [B] on k's device; 1 where k == n.
    """
    kk = k.double().cpu().numpy()
    nn_ = torch.as_tensor(n, dtype=torch.float64).cpu().numpy() + 0 * kk
    bound = torch.from_numpy(stats.beta.ppf(level, kk + 1, (nn_ - kk).clip(min=1e-300))).to(k.device)
    return torch.where(torch.from_numpy(kk >= nn_).to(k.device), 1.0, bound)
