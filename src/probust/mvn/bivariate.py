"""Bivariate normal CDF in closed form, with its exact gradient: the k_eff <= 2 case of :func:`probust.mvn.mvn_cdf`."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from probust.mvn.numerics import ndtr, tree_sum

__all__ = ["BVN_ERROR", "bvn_cdf"]

BVN_ERROR = 1e-14  # accuracy of the bivariate closed form
_GL_X, _GL_W = np.polynomial.legendre.leggauss(20)


def _bvn_upper(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """P(X > h, Y > k) for standard bivariate normals with correlation r (Genz's BVNU).

    Drezner & Wesolowsky (1990) as refined by Genz (2004): Gauss-Legendre on the Plackett
    integral for |r| < 0.925, and for |r| >= 0.925 an expansion around the singular limit that
    keeps ~1e-15 accuracy up to |r| = 1. Every branch is evaluated on safe inputs and the right
    one selected, so no NaN can leak. h, k finite; |r| <= 1.
    """
    x = torch.as_tensor(1.0 + _GL_X, dtype=h.dtype, device=h.device)  # nodes on [0, 2]
    w = torch.as_tensor(_GL_W, dtype=h.dtype, device=h.device)
    hk = h * k
    two_pi = 2.0 * math.pi

    # |r| < 0.925
    small = r.abs() < 0.925
    rs = torch.where(small, r, 0.0)
    asr = torch.asin(rs) / 2
    sn = torch.sin(asr[..., None] * x)
    hs = (h * h + k * k) / 2
    quad = tree_sum(torch.exp((sn * hk[..., None] - hs[..., None]) / (1 - sn * sn)) * w)
    p_small = quad * asr / two_pi + ndtr(-h) * ndtr(-k)

    # |r| >= 0.925
    neg = r < 0
    kk = torch.where(neg, -k, k)
    hkk = torch.where(neg, -hk, hk)
    singular = r.abs() >= 1.0
    rl = torch.where(small | singular, 0.95, r.abs())  # safe value where unused
    a2 = (1 - rl) * (1 + rl)
    a = torch.sqrt(a2)
    bs = (h - kk) ** 2
    c = (4 - hkk) / 8
    d = (12 - hkk) / 80
    asr2 = -(bs / a2 + hkk) / 2
    term = a * torch.exp(asr2) * (1 - c * (bs - a2) * (1 - d * bs) / 3 + c * d * a2 * a2)
    term = torch.where(asr2 > -100, term, 0.0)
    b = torch.sqrt(bs)
    sp = math.sqrt(two_pi) * ndtr(-b / a)
    corr = torch.exp(-hkk / 2) * sp * b * (1 - c * bs * (1 - d * bs) / 3)
    term = term - torch.where(hkk > -100, corr, 0.0)
    ah = a / 2
    xs = (ah[..., None] * x) ** 2
    asr3 = -(bs[..., None] / xs + hkk[..., None]) / 2
    sp3 = 1 + c[..., None] * xs * (1 + 5 * d[..., None] * xs)
    rs3 = torch.sqrt(1 - xs)
    ep = torch.exp(-(hkk[..., None] / 2) * xs / (1 + rs3) ** 2) / rs3
    inner = torch.where(asr3 > -100, torch.exp(asr3) * (sp3 - ep), 0.0)
    p_large = (ah * tree_sum(inner * w) - term) / two_pi
    p_large = torch.where(singular, 0.0, p_large)
    pos_part = p_large + ndtr(-torch.maximum(h, kk))
    between = torch.where(h < 0, ndtr(kk) - ndtr(h), ndtr(-h) - ndtr(-kk))
    neg_part = torch.where(h >= kk, -p_large, between - p_large)
    p_large = torch.where(neg, neg_part, pos_part)

    return torch.where(small, p_small, p_large).clamp(0.0, 1.0)


class _BVN(torch.autograd.Function):
    """Bivariate normal CDF with its exact gradient (densities), not autograd through the series."""

    @staticmethod
    def forward(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
        return _bvn_upper(-h, -k, r)

    @staticmethod
    def setup_context(ctx, inputs, output) -> None:
        ctx.save_for_backward(*inputs)

    @staticmethod
    def backward(ctx, grad: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        h, k, r = ctx.saved_tensors
        one_minus = ((1 - r) * (1 + r)).clamp_min(0.0)
        s = torch.sqrt(one_minus)
        safe_s = torch.where(s > 0, s, 1.0)
        # On |r| = 1 the conditional law is a point mass: Phi((k - r h)/s) becomes a step.
        cond_k = torch.where(s > 0, ndtr((k - r * h) / safe_s), ((k - r * h) >= 0).to(h.dtype))
        cond_h = torch.where(s > 0, ndtr((h - r * k) / safe_s), ((h - r * k) >= 0).to(h.dtype))
        pdf = lambda t: torch.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)
        gh = pdf(h) * cond_k
        gk = pdf(k) * cond_h
        quad = (h * h - 2 * r * h * k + k * k) / torch.where(s > 0, one_minus, 1.0)
        gr = torch.where(s > 0, torch.exp(-0.5 * quad) / (2 * math.pi * safe_s), 0.0)
        return grad * gh, grad * gk, grad * gr


def bvn_cdf(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """P(X <= h, Y <= k) for standard normal margins with correlation r, elementwise.

    Args:
        h, k: float64 [...] finite bounds, in standard deviations.
        r: float64 [...] correlations (clamped to [-1, 1]).

    Returns:
        float64 [...], within BVN_ERROR (absolute) of the truth. Differentiable in h, k and r
        with the exact gradient (densities), not autograd through the series.
    """
    return _BVN.apply(h, k, r.clamp(-1.0, 1.0))
