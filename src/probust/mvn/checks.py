"""Input and option checks shared by the mvn functions: a ValueError that names the argument."""

from __future__ import annotations

import math

import numpy as np
import torch
from torch import Tensor

from probust.errors import OptionError

__all__ = ["check_inputs", "check_options"]


def check_inputs(upper: Tensor, cov: Tensor) -> tuple[Tensor, Tensor, torch.Size]:
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


def check_options(tol: float, max_samples: int, seed: int) -> tuple[float, int, int]:
    """Validate the options: -> (tol as float >= 0, max_samples as int >= 1, seed as int >= 0);
    an :class:`~probust.errors.OptionError` naming the option otherwise."""
    try:
        tol = float(tol)
    except (TypeError, ValueError):
        raise OptionError(f"must be a number >= 0, got {tol!r}", field="tol") from None
    if not (tol >= 0.0) or math.isinf(tol):
        raise OptionError(f"must be a finite number >= 0, got {tol!r}", field="tol")
    if isinstance(max_samples, bool) or not isinstance(max_samples, (int, np.integer)) or max_samples < 1:
        raise OptionError(f"must be an integer >= 1, got {max_samples!r}", field="max_samples")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
        raise OptionError(f"must be an integer >= 0, got {seed!r}", field="seed")
    return tol, int(max_samples), int(seed)
