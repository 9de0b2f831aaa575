"""Noise models: how to sample them, and the second moment the analytic estimators need.

Every noise model here has zero mean and is added to ``x`` in the units ``x`` lives in
(e.g. pixels in [0, 1]); nothing is clipped. The analytic estimators only need the
covariance ``S`` of the noise, through the quadratic form ``u S u^T`` of the boundary
normals ``u`` (the paper's non-isotropic lemma; for non-Gaussian noise its CLT lemma).
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from typing import cast

import torch
from torch import Tensor

from probust import _rng
from probust._checks import check_positive_float
from probust.errors import OptionError, Setting


class Noise(ABC):
    """A zero-mean noise distribution over inputs of one shape."""

    #: True when the analytic estimators are exact for linear models under this noise.
    is_gaussian: bool = False

    @abstractmethod
    def sample(self, keys: Tensor, start: int, n: int, shape: torch.Size) -> Tensor:
        """Noise for samples ``start..start+n-1`` of each point.

        Args:
            keys: int64 [B] per-point keys from :func:`probust._rng.point_keys`.
            start: index of the first sample (so draws continue where a previous call stopped).
            n: number of samples per point.
            shape: the shape of one input, e.g. (1, 28, 28).

        Returns:
            float32 [B, n, *shape] on ``keys.device``.
        """

    @abstractmethod
    def quadratic_form(self, u: Tensor) -> Tensor:
        """``u S u^T`` for boundary normals ``u`` [B, k, *input_shape]: float64 [B, k, k]."""

    @abstractmethod
    def describe(self) -> dict:
        """A JSON-serialisable description, kept in results metadata."""

    def check_shape(self, shape: torch.Size) -> None:  # noqa: B027 - optional hook: most noises fit any shape
        """Raise ValueError when this noise cannot be added to inputs of ``shape``."""


class Gaussian(Noise):
    """Gaussian noise N(0, S).

    Exactly one of:
        sigma: a float, the standard deviation of every input coordinate (S = sigma^2 I);
            or a tensor broadcastable to the input shape: a standard deviation per coordinate
            (S diagonal).
        cov: a full covariance [d, d] over the flattened input (d = number of input
            coordinates), positive semi-definite.
    """

    is_gaussian = True

    def __init__(self, sigma: float | Tensor | None = None, *, cov: Tensor | None = None) -> None:
        if (sigma is None) == (cov is None):
            raise OptionError(
                "Gaussian needs exactly one of ",
                Setting("sigma"),
                " (per-coordinate std) or ",
                Setting("cov"),
                " (full covariance)",
            )
        self.sigma: float | None = None
        self.std: Tensor | None = None
        self.cov: Tensor | None = None
        self._chol: Tensor | None = None
        if cov is not None:
            cov = torch.as_tensor(cov, dtype=torch.float64)
            if cov.ndim != 2 or cov.shape[0] != cov.shape[1]:
                raise OptionError(f"must be a square matrix [d, d], got shape {tuple(cov.shape)}", field="cov")
            if not torch.isfinite(cov).all() or not torch.allclose(cov, cov.T, atol=1e-10):
                raise OptionError("must be a finite symmetric matrix", field="cov")
            eig_min = torch.linalg.eigvalsh(cov).min().item()
            if eig_min < -1e-8 * max(1.0, cov.diagonal().abs().max().item()):
                raise OptionError(f"must be positive semi-definite (smallest eigenvalue {eig_min:.3g})", field="cov")
            self.cov = cov
            # A PSD square root (works for singular cov, unlike Cholesky).
            vals, vecs = torch.linalg.eigh(cov)
            self._chol = (vecs * vals.clamp_min(0).sqrt()).to(torch.float32)
        elif isinstance(sigma, Tensor) and sigma.numel() > 1:
            std = sigma.detach().to(torch.float32)
            if not torch.isfinite(std).all() or (std < 0).any() or not (std > 0).any():
                raise OptionError(
                    "per-coordinate standard deviations must be finite, >= 0 and not all 0", field="sigma"
                )
            self.std = std
        else:
            self.sigma = check_positive_float(
                cast(float, sigma.item() if isinstance(sigma, Tensor) else sigma), "sigma"
            )

    def check_shape(self, shape: torch.Size) -> None:
        d = math.prod(shape)
        if self.cov is not None and self.cov.shape[0] != d:
            raise ValueError(f"cov is {tuple(self.cov.shape)} but inputs have {d} coordinates (shape {tuple(shape)})")
        if self.std is not None:
            try:
                torch.broadcast_shapes(self.std.shape, shape)
            except RuntimeError:
                raise ValueError(
                    f"sigma of shape {tuple(self.std.shape)} does not broadcast to the input shape {tuple(shape)}"
                ) from None

    def sample(self, keys: Tensor, start: int, n: int, shape: torch.Size) -> Tensor:
        d = math.prod(shape)
        z = _rng.normal(keys, start, n, d)
        if self._chol is not None:  # set with cov
            z = z @ self._chol.to(z.device).T
        z = z.view(keys.shape[0], n, *shape)
        # In place: z is this call's own tensor, and a second [B, n, *shape] buffer costs a
        # cheap model's Monte Carlo pass as much as its forward pass.
        if self.std is not None:
            return z.mul_(self.std.to(z.device))
        if self.sigma is not None:
            return z.mul_(self.sigma)
        return z

    def quadratic_form(self, u: Tensor) -> Tensor:
        flat = u.flatten(2).to(torch.float64)
        if self.sigma is not None:
            return self.sigma**2 * (flat @ flat.transpose(-1, -2))
        if self.std is not None:
            var = torch.broadcast_to(self.std.to(u.device, torch.float64) ** 2, u.shape[2:]).reshape(-1)
            return (flat * var) @ flat.transpose(-1, -2)
        assert self.cov is not None  # one of sigma, std, cov is set
        return flat @ self.cov.to(u.device) @ flat.transpose(-1, -2)

    def describe(self) -> dict:
        if self.sigma is not None:
            return {"noise": "gaussian", "sigma": self.sigma}
        if self.std is not None:
            return {"noise": "gaussian-diagonal", "sigma_mean": float(self.std.mean())}
        assert self.cov is not None
        return {"noise": "gaussian-full", "trace": float(self.cov.trace())}


class _IidNoise(Noise):
    """Coordinate-wise i.i.d. noise with standard deviation ``sigma`` (covariance sigma^2 I)."""

    name = ""

    def __init__(self, sigma: float) -> None:
        self.sigma = check_positive_float(sigma, "sigma")

    def quadratic_form(self, u: Tensor) -> Tensor:
        flat = u.flatten(2).to(torch.float64)
        return self.sigma**2 * (flat @ flat.transpose(-1, -2))

    def describe(self) -> dict:
        return {"noise": self.name, "sigma": self.sigma}

    def sample(self, keys: Tensor, start: int, n: int, shape: torch.Size) -> Tensor:
        u = _rng.uniform(keys, start, n, math.prod(shape))
        return self._from_uniform(u).view(keys.shape[0], n, *shape)

    @abstractmethod
    def _from_uniform(self, u: Tensor) -> Tensor: ...


class Uniform(_IidNoise):
    """Uniform noise on [-a, a] per coordinate with a = sqrt(3) * sigma, so its std is ``sigma``."""

    name = "uniform"

    def _from_uniform(self, u: Tensor) -> Tensor:
        return (2.0 * u - 1.0) * (math.sqrt(3.0) * self.sigma)


class Laplace(_IidNoise):
    """Laplace noise per coordinate with scale b = sigma / sqrt(2), so its std is ``sigma``."""

    name = "laplace"

    def _from_uniform(self, u: Tensor) -> Tensor:
        b = self.sigma / math.sqrt(2.0)
        centred = u - 0.5
        return -b * torch.sign(centred) * torch.log1p(-2.0 * centred.abs())


def require_gaussian(noise: Noise, method: str) -> None:
    """Raise an OptionError (field "sigma") unless ``noise`` is :class:`Gaussian` (what ``method`` needs).

    The Monte Carlo methods built on the linearised model ("mc_cv", "mc_is") need it: the
    control variate's mean is the mvn-cdf, and importance weights are Gaussian density ratios.
    """
    if not isinstance(noise, Gaussian):
        raise OptionError(
            f"{method} needs Gaussian noise: a number, a tensor of per-coordinate standard deviations or a "
            f"probust.Gaussian, got {type(noise).__name__}; use ",
            Setting("method", "mc"),
            " for other noise",
            field="sigma",
        )


def as_noise(sigma: float | Tensor | Noise | None) -> Noise:
    """Turn the user's ``sigma`` argument into a :class:`Noise` (a float means isotropic Gaussian)."""
    if isinstance(sigma, Noise):
        return sigma
    if sigma is None:
        raise OptionError("required: the noise standard deviation per input coordinate (or a Noise)", field="sigma")
    if isinstance(sigma, bool):
        raise OptionError(f"must be a positive number or a probust.noise.Noise, got {sigma!r}", field="sigma")
    return Gaussian(sigma)


def noise_words(noise: Noise) -> str:
    """The noise's description in words, e.g. ``gaussian sigma=0.5``, for error messages."""
    description = noise.describe()
    kind = str(description.get("noise", type(noise).__name__))
    return " ".join([kind] + [f"{key}={value}" for key, value in description.items() if key != "noise"])
