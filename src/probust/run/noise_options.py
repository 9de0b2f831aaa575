"""The noise of a run beyond isotropic Gaussian: its kind, per-coordinate scales or a full
covariance, and what ``config.json`` records of it.

Every noise level ``sigma`` of the run scales one fixed shape of noise:

* ``noise_std`` (an array broadcastable to one input's shape): a per-coordinate *multiplier*;
  coordinate j gets standard deviation ``sigma * noise_std[j]`` (Gaussian, diagonal covariance).
* ``noise_cov`` ([d, d] over the flattened input): covariance ``sigma**2 * noise_cov``.
* ``noise_scale="std"``: ``noise_std`` is each coordinate's standard deviation over the whole
  data set (all its points, not only those scored): for a table, sigma is in units of each
  feature's spread.
* ``noise="uniform"`` / ``"laplace"``: i.i.d. per coordinate with standard deviation ``sigma``.

The default (Gaussian, ``sigma`` per coordinate) passes ``sigma`` on as a number, exactly as
before these options existed.
"""

from __future__ import annotations

import functools
import hashlib
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor

from probust._untrusted import numpy_load
from probust.errors import Setting
from probust.noise import Gaussian, Laplace, Noise, Uniform
from probust.run.errors import ConfigError, first_line

__all__ = ["NOISE_KINDS", "NOISE_SCALES", "NoiseSetting", "check_noise", "noise_setting"]

NOISE_KINDS = ("gaussian", "uniform", "laplace")
NOISE_SCALES = ("absolute", "std")
#: What a folder written before these options implicitly used.
DEFAULT_DESCRIPTION: dict[str, Any] = {"kind": "gaussian"}


@dataclass(frozen=True)
class NoiseSetting:
    """The noise of a run, for any ``sigma``: :meth:`at` gives what the estimators take.

    Attributes:
        kind: one of :data:`NOISE_KINDS`.
        std: float32, broadcastable to one input's shape: the per-coordinate multiplier of
            sigma (Gaussian only); None.
        cov: float64 [d, d], the covariance at sigma = 1 (Gaussian only); None.
        description: what ``config.json`` records ("run" -> "noise").
    """

    kind: str = "gaussian"
    std: Tensor | None = None
    cov: Tensor | None = None
    description: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_DESCRIPTION))

    def at(self, sigma: float) -> float | Noise:
        """The noise at level ``sigma``: the number itself for isotropic Gaussian noise."""
        if self.kind == "uniform":
            return Uniform(sigma)
        if self.kind == "laplace":
            return Laplace(sigma)
        if self.cov is not None:
            return Gaussian(cov=sigma**2 * self.cov)
        if self.std is not None:
            return Gaussian(sigma * self.std)
        return sigma


def check_noise(noise: str, noise_std: Any, noise_cov: Any, noise_scale: str, gaussian_methods: list[str]) -> None:
    """Check the noise settings by themselves (before the data are loaded).

    Args:
        gaussian_methods: the run's methods that need Gaussian noise.
    """
    if noise not in NOISE_KINDS:
        raise ConfigError(f"expected one of {', '.join(NOISE_KINDS)}, got {noise!r}", field="noise")
    if noise_scale not in NOISE_SCALES:
        raise ConfigError(f"expected one of {', '.join(NOISE_SCALES)}, got {noise_scale!r}", field="noise_scale")
    shaped = [
        name
        for name, given in (("noise_std", noise_std is not None), ("noise_cov", noise_cov is not None))
        + (("noise_scale", noise_scale != "absolute"),)
        if given
    ]
    if len(shaped) > 1:
        raise ConfigError(f"cannot be combined with {shaped[0]} (give one shape of noise)", field=shaped[1])
    if shaped and noise != "gaussian":
        raise ConfigError("applies to Gaussian noise only, not to ", Setting("noise", noise), field=shaped[0])
    if noise != "gaussian" and gaussian_methods:
        raise ConfigError(
            f"{', '.join(gaussian_methods)} {'needs' if len(gaussian_methods) == 1 else 'need'} Gaussian noise (their correction is a Gaussian "
            f"integral), got ",
            Setting("noise", noise),
            "; use mc for other noise",
            field="noise",
        )


def _array(value: Any, name: str) -> tuple[np.ndarray, dict[str, Any]]:
    """An array given as a ``.npy`` file or in memory, and how config.json names it."""
    if isinstance(value, (str, os.PathLike)):
        path = Path(value)
        try:
            array = numpy_load(
                path,
                error=functools.partial(ConfigError, field=name, path=path),
                advice="save the numbers as a plain array (numpy.save of a float array)",
            )
        except ConfigError:
            raise
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"cannot read {path} as a .npy array ({first_line(exc)})", field=name, path=path
            ) from None
        where: dict[str, Any] = {"file": str(path.resolve())}
    else:
        array = value.detach().cpu().numpy() if isinstance(value, Tensor) else np.asarray(value)
        where = {"file": None}
    if array.dtype.kind not in "iuf":
        raise ConfigError(f"must hold numbers, got dtype {array.dtype}", field=name)
    array = array.astype(np.float64)
    if not np.isfinite(array).all():
        raise ConfigError("holds NaN or infinite values", field=name)
    digest = hashlib.sha256(np.ascontiguousarray(array).tobytes() + str(array.shape).encode()).hexdigest()
    return array, {**where, "shape": list(array.shape), "sha256": digest}


def noise_setting(
    noise: str, noise_std: Any, noise_cov: Any, noise_scale: str, input_shape: tuple[int, ...], data: Tensor | None
) -> NoiseSetting:
    """The run's noise, checked against the data's input shape.

    Args:
        data: every input of the data set, float [N, *input_shape] (used by ``noise_scale="std"``
            only; None otherwise).
    """
    description: dict[str, Any] = {"kind": noise}
    if noise_std is not None:
        array, where = _array(noise_std, "noise_std")
        try:
            torch.broadcast_shapes(array.shape, input_shape)
        except RuntimeError:
            raise ConfigError(
                f"shape {list(array.shape)} does not broadcast to the input shape {list(input_shape)}",
                field="noise_std",
            ) from None
        if (array < 0).any() or not (array > 0).any():
            raise ConfigError("multipliers must be >= 0 and not all 0", field="noise_std")
        return NoiseSetting(
            noise, std=torch.from_numpy(array).to(torch.float32), description={**description, "std": where}
        )
    if noise_cov is not None:
        array, where = _array(noise_cov, "noise_cov")
        d = math.prod(input_shape)
        if array.shape != (d, d):
            raise ConfigError(
                f"must be [d, d] with d = {d} coordinates (input shape {list(input_shape)}), got {list(array.shape)}",
                field="noise_cov",
            )
        try:
            Gaussian(cov=torch.from_numpy(array))
        except ValueError as exc:
            raise ConfigError(f"{first_line(exc)}", field="noise_cov") from None
        return NoiseSetting(noise, cov=torch.from_numpy(array), description={**description, "cov": where})
    if noise_scale == "std":
        assert data is not None
        std = data.to(torch.float64).std(dim=0, unbiased=False)
        if not (std > 0).any():
            raise ConfigError("every coordinate of the data is constant, so the noise would be 0", field="noise_scale")
        digest = hashlib.sha256(std.numpy().tobytes()).hexdigest()
        description.update(scale="std", std_sha256=digest)
        return NoiseSetting(noise, std=std.to(torch.float32), description=description)
    return NoiseSetting(noise, description=description)
