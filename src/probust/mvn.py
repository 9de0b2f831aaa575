"""Batched, differentiable multivariate normal CDF in torch.

``mvn_cdf(upper, cov)`` is P(X_1 <= upper_1, ..., X_k <= upper_k) for a zero-mean Gaussian
X ~ N(0, cov), for a whole batch of (upper, cov) pairs at once. It is the probability map of the
``taylor`` and ``mmse`` estimators (paper, section 3): the chance that no decision boundary is
crossed.

How it is computed, per point and vectorised over the batch:

* Coordinates that cannot matter are removed first: ``upper_i = +inf``, zero-variance coordinates
  (an exact factor 0 or 1) and, where >= 3 coordinates are constrained, those whose marginal tail
  P(X_i > upper_i) is negligible against ``tol``: dropping them can only raise the probability,
  by at most the sum of their tails, so the estimate is centred in that interval and its width
  is added to the error. Near-1 probabilities over many far boundaries shrink the most.
* What is left has k_eff <= 2 dimensions -> closed forms (``ndtr``; Genz's bivariate algorithm).
* k_eff >= 3 -> Genz's separation-of-variables transform with Genz-Bretz variable reordering and a
  pivoted Cholesky factor that turns exactly dependent variables (singular covariance) into bounds
  on earlier ones, integrated by randomised quasi-Monte Carlo (scrambled Sobol' points, several
  independent scramblings for the error estimate), adaptively: each point stops on its own.

The QMC points and their randomisation depend only on ``seed``, never on the batch, and only
elementwise arithmetic and sums in a fixed order touch a point's numbers (no BLAS, whose blocking
may depend on the batch), so a point's value is bitwise the same whatever else is in the batch,
and with or without autograd. Gradients flow to ``upper`` and ``cov`` through autograd with the
QMC points held fixed (the variable ordering is a detached, discrete choice).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch
from torch import Tensor

from probust import _qmc

__all__ = ["mvn_cdf"]

_REPLICATES = 8  # independent scramblings; error = t-quantile x standard error over these
_T_99 = 3.5  # two-sided 99% quantile of Student's t with _REPLICATES - 1 = 7 dof (3.4995)
_FIRST_STAGE = 32  # points per replicate in the first stage; each later stage doubles the total
_SAMPLE_CHUNK = 1024  # points per replicate evaluated together (fixed: fixes the summation order)
_SLAB = 1 << 15  # (problems x samples) per integrand call; it holds K times as many doubles
_MIN_STOP = 2 * _FIRST_STAGE  # points per replicate before any problem may stop (see _qmc_cdf)
_GUARD = 2.0**-1.5  # a stage's error may not fall below this share of the previous one's (_qmc_cdf)
_MIN_FOLDED = 1024  # points per replicate before a problem with folded constraints may stop
_DET_VAR = 1e-10  # conditional variance (correlation units) below which a variable is determined
_COEF_EPS = 1e-10  # |Cholesky coefficient| below which it is rounding noise
_DROP_FRACTION = 0.05  # share of tol that dropped negligible coordinates may cost, at most
_BVN_ERROR = 1e-14  # accuracy of the bivariate closed form
_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_SQRT1_2 = math.sqrt(0.5)
_GL_X, _GL_W = np.polynomial.legendre.leggauss(20)


def mvn_cdf(
    upper: Tensor,
    cov: Tensor,
    *,
    tol: float = 1e-4,
    max_samples: int = 200_000,
    seed: int = 0,
    return_error: bool = False,
) -> Tensor | tuple[Tensor, Tensor]:
    """P(X_1 <= upper_1, ..., X_k <= upper_k) for X ~ N(0, cov), batched.

    Args:
        upper: [..., k] upper integration limits of a zero-mean Gaussian; +inf leaves a
            coordinate unconstrained (its row of ``cov`` is then ignored), -inf makes the
            probability 0. Any real dtype.
        cov: [..., k, k] symmetric positive semi-definite covariance; singular is fine, and a
            zero variance makes X_i == 0 exactly. Batch dims broadcast against ``upper``'s.
        tol: absolute error at which a point stops sampling (k_eff >= 3 only; 0 = never, i.e.
            spend ``max_samples``, which makes the estimate a smooth function of the inputs).
        max_samples: cap on the QMC samples spent on one point (in 8 replicates of
            ``max_samples // 8``, at least 2 each).
        seed: fixes the randomisation. It is the same for every point, and a point's value does
            not depend on the rest of the batch (bitwise), nor on whether autograd is on.
        return_error: also return the error estimate.

    Returns:
        float64 [...] probabilities on ``upper``'s device, and with ``return_error`` a float64
        [...] absolute error estimate: about a 99% bound on |estimate - truth| (3.5 standard
        errors over 8 independent randomisations, plus the bound on what dropped coordinates
        can cost); ~0 (<= 1e-14) where at most 2 dimensions are left.

    Raises:
        ValueError: NaN, wrong or mismatched shapes, a non-symmetric or clearly non-PSD ``cov``
            (a negative eigenvalue beyond rounding), or bad options; the message names the
            argument.

    Gradients with respect to ``upper`` and ``cov`` are those of the QMC estimate with its
    points held fixed (exact for k_eff <= 2); the variable ordering and the number of samples a
    point used are discrete choices made without gradient.
    """
    problem = _prepare(upper, cov, tol=tol, max_samples=max_samples, seed=seed)
    p, err = _mvn_cdf_flat(problem)
    p, err = problem.unflatten(p), problem.unflatten(err)
    return (p, err) if return_error else p


# --------------------------------------------------------------------------------------------
# the checked, standardised problem (shared with probust.tails)


@dataclass(frozen=True)
class _Problem:
    """A checked batch of problems about X ~ N(0, cov) and bounds ``upper``, flattened to [n, k]
    and standardised: what :func:`mvn_cdf` and :func:`probust.tails.mvn_sf` both start from.

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


def _prepare(
    upper: Tensor, cov: Tensor, *, tol: float = 1e-4, max_samples: int = 200_000, seed: int = 0
) -> _Problem:
    """Check the inputs and options (ValueError naming the argument), broadcast, flatten and
    standardise them: the one entry point of every public function over (upper, cov)."""
    upper, cov, batch_shape = _check_inputs(upper, cov)
    tol, max_samples, seed = _check_options(tol, max_samples, seed)
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
    return _Problem(upper, z, corr, frozen, finite, batch_shape, tol, max_samples, seed)


# --------------------------------------------------------------------------------------------
# input checks


def _check_inputs(upper: Tensor, cov: Tensor) -> tuple[Tensor, Tensor, torch.Size]:
    """Validate, cast to float64 and broadcast: -> upper [*S, k], cov [*S, k, k], S."""
    for name, value in (("upper", upper), ("cov", cov)):
        if not isinstance(value, Tensor):
            raise ValueError(f"{name} must be a torch.Tensor, got {type(value).__name__}")
        if value.is_complex() or value.dtype == torch.bool:
            raise ValueError(f"{name} must be a real tensor, got dtype {value.dtype}")
    if upper.ndim < 1:
        raise ValueError(f"upper must have shape [..., k], got a scalar (shape {tuple(upper.shape)})")
    if cov.ndim < 2 or cov.shape[-1] != cov.shape[-2]:
        raise ValueError(f"cov must be square with shape [..., k, k], got {tuple(cov.shape)}")
    if cov.shape[-1] != upper.shape[-1]:
        raise ValueError(
            f"cov [..., k, k] must match upper [..., k]: got k = {cov.shape[-1]} for cov "
            f"and k = {upper.shape[-1]} for upper"
        )
    if cov.device != upper.device:
        raise ValueError(f"cov is on {cov.device} but upper is on {upper.device}; put them on one device")
    batch_shape = _broadcast(upper.shape[:-1], cov.shape[:-2])
    in_dtype = cov.dtype
    upper = upper.to(torch.float64)
    cov = cov.to(torch.float64)
    if torch.isnan(upper).any():
        raise ValueError("upper contains NaN; expected real numbers or +-inf")
    if not torch.isfinite(cov).all():
        raise ValueError("cov contains NaN or inf; expected a finite covariance matrix")
    _check_psd(cov.detach(), in_dtype)
    k = upper.shape[-1]
    upper = upper.expand(*batch_shape, k)
    cov = cov.expand(*batch_shape, k, k)
    return upper, cov, batch_shape


def _broadcast(a: torch.Size, b: torch.Size) -> torch.Size:
    # torch.broadcast_shapes imports sympy on first use (about a second).
    out = []
    for i in range(1, max(len(a), len(b)) + 1):
        x = a[-i] if i <= len(a) else 1
        y = b[-i] if i <= len(b) else 1
        if x != y and 1 not in (x, y):
            raise ValueError(f"the batch dims of upper {tuple(a)} and cov {tuple(b)} do not broadcast")
        out.append(y if x == 1 else x)
    return torch.Size(reversed(out))


def _psd_rtol(dtype: torch.dtype) -> float:
    """Relative slack for symmetry / PSD checks: rounding of a product like U U^T must pass."""
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else torch.finfo(torch.float64).eps
    return max(1e-8, 1000.0 * eps)


def _check_psd(cov: Tensor, in_dtype: torch.dtype) -> None:
    k = cov.shape[-1]
    if k == 0 or cov.numel() == 0:
        return
    rtol = _psd_rtol(in_dtype)
    diag = cov.diagonal(dim1=-2, dim2=-1)
    scale = diag.abs().amax(-1).clamp_min(torch.finfo(torch.float64).tiny)
    asym = (cov - cov.mT).abs().amax((-2, -1))
    if (asym > rtol * scale).any():
        raise ValueError(
            f"cov must be symmetric; found |cov - cov^T| up to {asym.max().item():.3g} "
            f"(relative to its largest variance)"
        )
    if (diag < -rtol * scale[..., None]).any():
        raise ValueError("cov must be positive semi-definite; found a negative variance on its diagonal")
    # A Cholesky of cov + slack * I succeeds iff no eigenvalue is below -slack: cheap, and it
    # tolerates the rounding of singular matrices such as U U^T with fewer columns than rows.
    slack = rtol * k * scale
    eye = torch.eye(k, dtype=cov.dtype, device=cov.device)
    info = torch.linalg.cholesky_ex(cov + slack[..., None, None] * eye).info
    if (info != 0).any():
        raise ValueError(
            "cov must be positive semi-definite; found a negative eigenvalue beyond rounding "
            f"(relative tolerance {rtol * k:.1e})"
        )


def _check_options(tol: float, max_samples: int, seed: int) -> tuple[float, int, int]:
    try:
        tol = float(tol)
    except (TypeError, ValueError):
        raise ValueError(f"tol must be a number >= 0, got {tol!r}") from None
    if not (tol >= 0.0) or math.isinf(tol):
        raise ValueError(f"tol must be a finite number >= 0, got {tol!r}")
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
        raise ValueError(f"max_samples must be an integer >= 1, got {max_samples!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise ValueError(f"seed must be an integer >= 0, got {seed!r}")
    return tol, int(max_samples), int(seed)


def _ndtr(x: Tensor) -> Tensor:
    """Standard normal CDF with full relative accuracy in the lower tail (torch.special.ndtr
    loses it below about -6 and returns 0 below about -8.5)."""
    return 0.5 * torch.erfc(x * -_SQRT1_2)


# --------------------------------------------------------------------------------------------
# reduction of each point to its effective problem


def _mvn_cdf_flat(problem: _Problem) -> tuple[Tensor, Tensor]:
    """A prepared problem [n, k] -> (p [n], err [n]), float64."""
    upper, z, corr, frozen, finite = problem.upper, problem.z, problem.corr, problem.frozen, problem.finite
    tol, max_samples, seed = problem.tol, problem.max_samples, problem.seed
    n, k = upper.shape
    device = upper.device
    p = torch.ones(n, dtype=torch.float64, device=device)
    err = torch.zeros(n, dtype=torch.float64, device=device)
    if n == 0 or k == 0:
        return p, err

    with torch.no_grad():
        dead = (upper == -torch.inf) | (frozen & (upper < 0))
        dead = dead.any(-1)
        tail = torch.where(finite & ~frozen, _ndtr(-z), 0.0)
        # Negligible tails are dropped only where that saves sampling (>= 3 constrained
        # coordinates); the budget is shared by the constrained coordinates alone, so adding
        # +inf bounds changes nothing.
        constrained = (finite & ~frozen).sum(-1, keepdim=True)
        drop_eps = torch.where(constrained >= 3, tol * _DROP_FRACTION / constrained.clamp_min(1), 0.0)
        drop = frozen | (upper == torch.inf) | (tail < drop_eps)
        bias = torch.where(drop, tail, 0.0).sum(-1)
        keep = ~drop & ~dead[:, None]
        k_eff = keep.sum(-1)

    # Kept coordinates first, in their original order: the small cases read them off the front.
    order = torch.argsort((~keep).to(torch.int8), dim=-1, stable=True)
    for size in (1, 2):
        idx = (k_eff == size).nonzero().flatten()
        if len(idx):
            cols = order[idx, :size]
            zs = z[idx].gather(1, cols)
            if size == 1:
                val = _ndtr(zs[:, 0])
                e = torch.zeros_like(val)
            else:
                rho = corr[idx, cols[:, 0], cols[:, 1]]
                val = _bvn_cdf(zs[:, 0], zs[:, 1], rho)
                e = torch.full_like(val, _BVN_ERROR)
            p = p.index_copy(0, idx, val)
            err = err.index_copy(0, idx, e.detach())
    idx = (k_eff >= 3).nonzero().flatten()
    if len(idx):
        kmax = int(k_eff[idx].max())
        cols = order[idx, :kmax]
        pad = ~keep[idx].gather(1, cols)
        zs = torch.where(pad, 0.0, z[idx].gather(1, cols))
        cs = corr[idx].gather(1, cols[:, :, None].expand(-1, -1, k))
        cs = cs.gather(2, cols[:, None, :].expand(-1, kmax, -1))
        pad2 = pad[:, :, None] | pad[:, None, :]
        cs = torch.where(pad2, torch.eye(kmax, dtype=torch.float64, device=device), cs)
        # The dropped tails are a deterministic part of the error: sampling needs only the rest.
        target = (tol - bias[idx]).clamp_min(0.0)
        val, e = _qmc_cdf(zs, cs, pad, target=target, max_samples=max_samples, seed=seed)
        p = p.index_copy(0, idx, val)
        err = err.index_copy(0, idx, e)
    # The dropped constraints B remove mass P(A) - P(A and B) in [0, bias]: centre the estimate.
    p = torch.where(dead, 0.0, (p - 0.5 * bias).clamp(0.0, 1.0))
    err = torch.where(dead, 0.0, err + bias)
    return p, err.detach()


# --------------------------------------------------------------------------------------------
# bivariate closed form


def _bvn_upper(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """P(X > h, Y > k) for standard bivariate normals with correlation r (Genz's BVNU).

    Drezner & Wesolowsky (1990) as refined by Genz (2004): Gauss-Legendre on the Plackett
    integral for |r| < 0.925, and for |r| >= 0.925 an expansion around the singular limit that
    keeps ~1e-15 accuracy up to |r| = 1. Every branch is evaluated on safe inputs and the right
    one selected, so no NaN can leak. h, k finite; |r| <= 1.
    """
    ndtr = _ndtr
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
    quad = _tree_sum(torch.exp((sn * hk[..., None] - hs[..., None]) / (1 - sn * sn)) * w)
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
    p_large = (ah * _tree_sum(inner * w) - term) / two_pi
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
        ndtr = _ndtr
        # On |r| = 1 the conditional law is a point mass: Phi((k - r h)/s) becomes a step.
        cond_k = torch.where(s > 0, ndtr((k - r * h) / safe_s), ((k - r * h) >= 0).to(h.dtype))
        cond_h = torch.where(s > 0, ndtr((h - r * k) / safe_s), ((h - r * k) >= 0).to(h.dtype))
        pdf = lambda t: torch.exp(-0.5 * t * t) / math.sqrt(2 * math.pi)  # noqa: E731
        gh = pdf(h) * cond_k
        gk = pdf(k) * cond_h
        quad = (h * h - 2 * r * h * k + k * k) / torch.where(s > 0, one_minus, 1.0)
        gr = torch.where(s > 0, torch.exp(-0.5 * quad) / (2 * math.pi * safe_s), 0.0)
        return grad * gh, grad * gk, grad * gr


def _bvn_cdf(h: Tensor, k: Tensor, r: Tensor) -> Tensor:
    """P(X <= h, Y <= k), standard margins, correlation r; float64, same shape."""
    return _BVN.apply(h, k, r.clamp(-1.0, 1.0))


# --------------------------------------------------------------------------------------------
# k_eff >= 3: reordering, pivoted Cholesky, randomised QMC


def _tree_sum(x: Tensor, dim: int = -1) -> Tensor:
    """Sum over ``dim`` by pairwise halving: its rounding depends only on that dim's length.

    torch.sum's order can depend on the shape of the other dims (threads, vector lanes, device),
    which would make a point's value depend on its batch.
    """
    x = x.movedim(dim, -1)
    n = x.shape[-1]
    if n == 0:
        return x.new_zeros(x.shape[:-1])
    size = 1 << (n - 1).bit_length()
    if size != n:
        x = torch.nn.functional.pad(x, (0, size - n))
    while size > 1:
        size //= 2
        x = x[..., :size] + x[..., size:]
    return x[..., 0]


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
    for i in range(kk):
        var = schur.diagonal(dim1=1, dim2=2)
        bp = (b - mean) / torch.sqrt(var.clamp_min(_DET_VAR))
        cand = ~done & ~pad & (var > _DET_VAR)
        # Preference: random variables by bound, then determined ones, then padding.
        rank = torch.where(~done, 1e301, inf).where(done | ~pad, 1e300)
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


class _Factor:
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
    variables that depend on nothing) and steps [G] (a problem's effective dimension).
    """

    def __init__(self, bs, lts, offset, fold_step, fold_upper, const, steps) -> None:
        self.bs, self.lts, self.offset = bs, lts, offset
        self.fold_step, self.fold_upper = fold_step, fold_upper
        self.const, self.steps = const, steps

    def tensors(self, idx: Tensor) -> tuple[Tensor, ...]:
        return tuple(getattr(self, name)[idx] for name in _FIELDS)


def _factorise(z: Tensor, corr: Tensor, pad: Tensor) -> _Factor:
    """Reorder and factor a group of problems: z [G, K], corr [G, K, K], pad [G, K]."""
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
    return _Factor(bs, lts, offset, fold_step, fold_upper, const, steps)


_P_TAIL = 1e-6  # below this, erfinv(2p - 1) loses relative accuracy in p: use ndtri instead
_BELOW_ONE = 1.0 - 2.0**-53
_RESCALE_EVERY = 256  # steps between exact rescalings of the running product by 2^-256


def _genz_integrand(bs, lts, offset, fold_step, fold_upper, w: Tensor, n_steps: int) -> Tensor:
    """Genz's separation-of-variables integrand at QMC points w.

    Args:
        bs, offset, fold_step, fold_upper: [G, K]; lts: [G, K, K] (see _Factor).
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
    f = None
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


def _block_sums(bs, lts, offset, fold_step, fold_upper, w: Tensor, n_steps: int) -> Tensor:
    """Integrand summed over each replicate's points: w [D, R, m] -> [G, R]."""
    _, r, m = w.shape
    f = _genz_integrand(bs, lts, offset, fold_step, fold_upper, w.reshape(w.shape[0], r * m), n_steps)
    return _tree_sum(f.reshape(-1, r, m), -1)


class _Recomputed(torch.autograd.Function):
    """_block_sums that keeps only its inputs and recomputes itself in backward.

    A graph over every sample would hold (steps x samples) intermediates per problem; this
    holds the factors only. (torch.utils.checkpoint does the same but imports torch._dynamo,
    seconds, on first use.) The forward runs the in-place kernels, the backward the
    out-of-place ones: the same values.
    """

    @staticmethod
    def forward(ctx, w: Tensor, n_steps: int, *tensors: Tensor) -> Tensor:
        ctx.n_steps = n_steps
        ctx.save_for_backward(w, *tensors)
        with torch.no_grad():
            return _block_sums(*tensors, w, n_steps)

    @staticmethod
    def backward(ctx, grad: Tensor):
        w, *tensors = ctx.saved_tensors
        inputs = [t.detach().requires_grad_(t.is_floating_point()) for t in tensors]
        with torch.enable_grad():
            out = _block_sums(*inputs, w, ctx.n_steps)
        wanted = [x for x, need in zip(inputs, ctx.needs_input_grad[2:]) if need]
        grads = iter(torch.autograd.grad(out, wanted, grad, allow_unused=True))
        return (None, None, *(next(grads) if need else None for need in ctx.needs_input_grad[2:]))


def _qmc_cdf(z: Tensor, corr: Tensor, pad: Tensor | None = None, *, target: Tensor, max_samples: int,
             seed: int) -> tuple[Tensor, Tensor]:
    """Adaptive randomised QMC for a group of problems with k_eff >= 3 (also the engine of
    :mod:`probust.tails`' orthant terms).

    Args:
        z: [G, K] standardised finite bounds; corr: [G, K, K] correlations; pad: [G, K] padding
            coordinates (see _genz_bretz_cholesky), None: none.
        target: [G] error at which a problem stops.
        max_samples: cap on samples per problem; seed: the randomisation.

    Returns:
        (estimate [G], error [G]), float64.

    Stage s adds points [n_{s-1}, n_s) of every replicate's scrambled Sobol' sequence
    (n_0 = _FIRST_STAGE, n_s = 2 n_{s-1}); a problem leaves once 3.5 standard errors over the
    replicates are <= target, or when the next stage would pass max_samples.

    A spread of 8 replicate means underestimates the error when an integrand has narrow dips
    (probabilities near 1) that few points hit, and stopping at the first small estimate favours
    such underestimates. So no problem stops before two stages, and an estimate may not fall
    below 2^-1.5 of the previous stage's (scrambled Sobol' errors of smooth integrands shrink
    like n^-1.5 at best, so a faster fall is noise): on decision-boundary problems (k = 9, 99)
    this brings the share of errors beyond the estimate from about 2% to the nominal 1% or less.
    A problem with constraints folded from a singular covariance has an integrand that is 0 on
    whole regions, so it is not trusted to stop before _MIN_FOLDED points per replicate.
    """
    g, kk = z.shape
    if pad is None:
        pad = torch.zeros(g, kk, dtype=torch.bool, device=z.device)
    fac = _factorise(z, corr, pad)
    needs_grad = torch.is_grad_enabled() and (z.requires_grad or corr.requires_grad)
    reps = _REPLICATES
    sums = torch.zeros(g, reps, dtype=torch.float64, device=z.device)
    count = torch.zeros(g, dtype=torch.float64, device=z.device)
    err = torch.full((g,), torch.inf, dtype=torch.float64, device=z.device)
    active = torch.arange(g, device=z.device)
    per_rep_cap = max(max_samples // reps, 2)
    folded = (fac.fold_step >= 0).any(-1)
    start, stop = 0, min(_FIRST_STAGE, per_rep_cap)
    while len(active) and start < per_rep_cap:
        stop = min(stop, per_rep_cap)
        # Blocks run as many steps as their largest problem needs: group similar sizes. (Which
        # problems share a block does not change any problem's value.)
        active = active[torch.argsort(fac.steps[active], stable=True)]
        new = torch.zeros(len(active), reps, dtype=torch.float64, device=z.device)
        for lo in range(start, stop, _SAMPLE_CHUNK):
            hi = min(lo + _SAMPLE_CHUNK, stop)
            w = _qmc.sobol_points(seed, reps, lo, hi, max(kk - 1, 1)).to(z.device)
            n_pts = max(1, _SLAB // (reps * (hi - lo)))
            parts = []
            for c0 in range(0, len(active), n_pts):
                sub = active[c0 : c0 + n_pts]
                n_steps = int(fac.steps[sub].max())
                args = fac.tensors(sub)
                if needs_grad:
                    parts.append(_Recomputed.apply(w, n_steps, *args))
                else:
                    with torch.no_grad():
                        parts.append(_block_sums(*args, w, n_steps))
            new = new + torch.cat(parts)
        sums = sums.index_add(0, active, new)
        count = count.index_fill(0, active, float(stop))
        with torch.no_grad():
            means = sums[active] / stop
            centred = means - _tree_sum(means, -1)[:, None] / reps
            e_act = _T_99 * torch.sqrt(_tree_sum(centred * centred, -1) / (reps * (reps - 1)))
            prev = err[active]
            e_act = torch.where(torch.isinf(prev), e_act, torch.maximum(e_act, prev * _GUARD))
        err = err.index_copy(0, active, e_act)
        early = (folded[active] & (stop < _MIN_FOLDED)) | (stop < _MIN_STOP)
        active = active[(e_act > target[active]) | early]
        start, stop = stop, 2 * stop
    est = _tree_sum(sums / count[:, None], -1) / reps * fac.const
    return est, err * fac.const
