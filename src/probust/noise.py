"""Noise: the models that are added to ``x``, and the counter-based random numbers they are drawn with.

**Noise models** (:class:`Gaussian`, :class:`Uniform`, :class:`Laplace`). Every noise model has
zero mean and is added to ``x`` in the units ``x`` lives in (e.g. pixels in [0, 1]); nothing is
clipped. The analytic estimators only need the covariance ``S`` of the noise, through the
quadratic form ``u S u^T`` of the boundary normals ``u`` (the paper's non-isotropic lemma; for
non-Gaussian noise its CLT lemma).

**Random streams** (:func:`point_keys`, :func:`normal_draws`, :func:`uniform_draws`): a point's
noise is a pure function of (seed, point index, stream). ``torch.Generator`` streams depend on the
order of draws, so a point's noise would change with batch size, order and resumption, and differ
between CPU and CUDA. Instead every random number is ``splitmix64(key + counter * golden)``, where
``key`` is derived from (seed, point index, stream) and ``counter`` enumerates (sample,
coordinate). The same integers come out on any device, in any chunking, so estimates are
reproducible value for value.
"""

from __future__ import annotations

import math
import threading
from abc import ABC, abstractmethod
from typing import cast

import torch
from torch import Tensor

from probust._checks import check_positive_float
from probust.errors import OptionError, Setting


def _s64(value: int) -> int:
    """An unsigned 64-bit constant as the signed int64 torch stores."""
    value &= (1 << 64) - 1
    return value - (1 << 64) if value >= 1 << 63 else value


_GOLDEN = _s64(0x9E3779B97F4A7C15)
_MIX1 = _s64(0xBF58476D1CE4E5B9)
_MIX2 = _s64(0x94D049BB133111EB)

# Streams keep the draws of different purposes independent for the same point.
STREAM_MC = 1
STREAM_MMSE = 2
STREAM_CONTROL = 3
STREAM_PRUNE = 4
# Randomized smoothing (probust.smoothing): CERTIFY's selection draws must be independent of its
# estimation draws (the class is chosen on the first, its probability bounded on the second);
# PREDICT has a stream of its own.
STREAM_CERTIFY_SELECT = 5
STREAM_CERTIFY_ESTIMATE = 6
STREAM_PREDICT = 7
STREAM_SCREEN = 9  # reverse-mode probes of the spectral screening (estimators/routes.py)
STREAM_TRUST = 10  # the fresh draws Taylor checks its linearisation on (estimators/trust.py)


def _shift_right(x: Tensor, bits: int) -> Tensor:
    # torch's >> on int64 is arithmetic; mask off the sign extension to get a logical shift.
    return (x >> bits) & ((1 << (64 - bits)) - 1)


def _mix(x: Tensor) -> Tensor:
    """splitmix64's finaliser (int64 arithmetic wraps modulo 2**64)."""
    x = (x ^ _shift_right(x, 30)) * _MIX1
    x = (x ^ _shift_right(x, 27)) * _MIX2
    return x ^ _shift_right(x, 31)


def point_keys(seed: int, indices: Tensor, stream: int) -> Tensor:
    """Per-point 64-bit keys.

    Args:
        seed: the user's seed (any Python int).
        indices: int64 [B], each point's index in the data set (not in the batch).
        stream: which purpose the numbers serve (``STREAM_*``).

    Returns:
        int64 [B] keys on ``indices.device``.
    """
    base = _mix(torch.tensor(_s64(seed * 0x2545F4914F6CDD1D + stream), dtype=torch.int64))
    idx = indices.to(torch.int64)
    return _mix(_mix(idx * _GOLDEN + base.to(idx.device)) + _s64(stream * 0x9E3779B97F4A7C15))


# Work on blocks of about this many 64-bit words: the dozen in-place passes of the hash then
# stay in the CPU's cache instead of streaming whole [B, n, d] tensors through memory.
_CHUNK_WORDS = 1 << 17
_LOW32 = 0xFFFFFFFF


def _counters(n: int, width: int, device: torch.device) -> Tensor:
    """(counter + 1) * golden for samples [0, n) x words [0, width): int64 [n, width].

    Kept per thread for the last few shapes (a call's passes repeat one shape): computing it is
    a tenth of a cheap model's Monte Carlo pass. Read-only: callers add to it out of place.
    """
    cache: dict[tuple[int, int, torch.device], Tensor] = _local_dict("counters")
    key = (n, width, device)
    counters = cache.get(key)
    if counters is None:
        # Not an inference tensor even when made under inference_mode: kept across calls.
        with torch.inference_mode(False):
            counter = (
                torch.arange(n, device=device, dtype=torch.int64)[:, None] * width
                + torch.arange(width, device=device, dtype=torch.int64)[None, :]
            )
            counters = (counter + 1) * _GOLDEN
        if n * width <= _CACHED_COUNTER_WORDS:
            if len(cache) >= _CACHED_COUNTER_SHAPES:
                cache.clear()
            cache[key] = counters
    return counters


def _start_offset(start: int, width: int) -> int:
    """What sample ``start`` adds to every counter of :func:`_counters`, modulo 2**64.

    ``(c + 1) * golden`` for counter ``c = (start + s) * width + w`` is the counter of sample
    ``s`` plus ``start * width * golden`` (wrapping arithmetic), so one table serves every start.
    """
    return _s64(start * width * 0x9E3779B97F4A7C15)


# What the kept tables may hold per thread: 2 tables of at most 16 MB (a pass of 500
# rows of 784 coordinates needs 1.6 MB; larger ones are recomputed per call).
_CACHED_COUNTER_WORDS = 1 << 21
_CACHED_COUNTER_SHAPES = 2
_THREAD = threading.local()


def _local_dict(name: str) -> dict:
    """A dict private to the calling thread (estimators may run in several threads at once)."""
    found = getattr(_THREAD, name, None)
    if found is None:
        found = {}
        setattr(_THREAD, name, found)
    return found


def _mix_(x: Tensor, tmp: Tensor) -> Tensor:
    """:func:`_mix` in place on ``x``, using ``tmp`` (same shape) as scratch: the same integers."""
    for bits, mult in ((30, _MIX1), (27, _MIX2), (31, None)):
        torch.bitwise_right_shift(x, bits, out=tmp)
        tmp &= (1 << (64 - bits)) - 1
        x ^= tmp
        if mult is not None:
            x *= mult
    return x


def _blocks(points: int, n: int, width: int):
    """Split (points x n samples x width words) into cache-sized (point slice, sample slice) blocks."""
    per_point = n * width
    if per_point <= _CHUNK_WORDS:
        group = max(1, _CHUNK_WORDS // per_point)
        for first in range(0, points, group):
            yield slice(first, min(first + group, points)), slice(0, n)
    else:
        rows = max(1, _CHUNK_WORDS // width)
        for b in range(points):
            for s in range(0, n, rows):
                yield slice(b, b + 1), slice(s, min(s + rows, n))


def _hashed(keys: Tensor, start: int, n: int, width: int):
    """Yield (point slice, sample slice, h, scratch) for cache-sized blocks.

    ``h`` holds the 64 random bits of each word of the block, int64 [points in block, samples
    in block, width], identical to ``_mix(keys + (counter + 1) * golden)``; ``scratch`` is an
    int64 buffer of the same shape. Both are reused between blocks: consume them first.
    """
    ctr = _counters(n, width, keys.device)
    shifted = keys + _start_offset(start, width)
    buffers = _scratch("bits", keys.device)
    for points, samples in _blocks(keys.shape[0], n, width):
        shape = (points.stop - points.start, samples.stop - samples.start, width)
        h, tmp = buffers.get(shape, torch.int64, 2)
        torch.add(ctr[None, samples], shifted[points, None, None], out=h)
        yield points, samples, _mix_(h, tmp), tmp


class _Scratch:
    """Buffers reused across blocks and calls (allocating per block or per pass would fault
    fresh pages every time)."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self.flat: dict[torch.dtype, list[Tensor]] = {}

    def get(self, shape: tuple[int, ...], dtype: torch.dtype, count: int) -> list[Tensor]:
        size = math.prod(shape)
        flat = self.flat.get(dtype)
        if flat is None or len(flat) < count or flat[0].numel() < size:
            # Normal tensors even under inference_mode: calls outside it write to them too.
            with torch.inference_mode(False):
                flat = [torch.empty(size, dtype=dtype, device=self.device) for _ in range(count)]
            self.flat[dtype] = flat
        return [buffer[:size].view(shape) for buffer in flat[:count]]


def _scratch(purpose: str, device: torch.device) -> _Scratch:
    """The calling thread's buffers for one purpose on one device, kept between calls.

    Two purposes, "bits" (the hash's words) and "floats" (their conversion), because a block's
    hash buffers are still in use while its floats are made.
    """
    store: dict[tuple[str, torch.device], _Scratch] = _local_dict("scratch")
    found = store.get((purpose, device))
    if found is None:
        found = store[(purpose, device)] = _Scratch(device)
    return found


def _bits(keys: Tensor, start: int, n: int, width: int) -> Tensor:
    """64 random bits for counters [start, start + n) x [0, width): int64 [B, n, width]."""
    out = torch.empty(keys.shape[0], n, width, dtype=torch.int64, device=keys.device)
    for points, samples, h, _ in _hashed(keys, start, n, width):
        out[points, samples] = h
    return out


def _unit(bits: Tensor, out: Tensor, scale: float = 2.0**-32) -> Tensor:
    """(bits + 0.5) * scale for 32-bit integers held in int64, in ``out``'s dtype.

    With the default scale a uniform in (0, 1). ``scale`` may fold a later multiplication by c
    in: ``scale = c * 2**-32`` gives the same floats as multiplying by 2**-32 and then by c,
    because scaling by a power of two is exact (c must be representable in ``out``'s dtype).
    """
    if out.dtype == torch.float32:
        # One pass: int64 + python float computes in float32 (round the integer, then add 0.5
        # with rounding), exactly what copying into float32 and adding 0.5 does.
        torch.add(bits, 0.5, out=out)
    else:  # float64 and others: such an add would compute in float32, so convert first
        out.copy_(bits)
        out += 0.5
    out *= scale
    return out


# 2 pi as a float32, times 2**-32 (exact): Box-Muller's angle in one multiplication.
_ANGLE_SCALE = {
    dtype: float(torch.tensor(2.0 * math.pi, dtype=dtype)) * 2.0**-32 for dtype in (torch.float32, torch.float64)
}


def uniform_draws(keys: Tensor, start: int, n: int, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniform(0, 1) numbers, open interval: [B, n, dim] for samples start..start+n-1."""
    pairs = (dim + 1) // 2
    # Two 32-bit uniforms per 64-bit word, made in float64 (exact), then cast.
    out = torch.empty(keys.shape[0], n, 2 * pairs, dtype=dtype, device=keys.device)
    floats = _scratch("floats", keys.device)
    for points, samples, h, scratch in _hashed(keys, start, n, pairs):
        (unit,) = floats.get(h.shape, torch.float64, 1)
        block = out[points, samples]
        torch.bitwise_right_shift(h, 32, out=scratch)
        scratch &= _LOW32
        block[..., :pairs] = _unit(scratch, unit)
        torch.bitwise_and(h, _LOW32, out=scratch)
        block[..., pairs:] = _unit(scratch, unit)
    return out[..., :dim]


def normal_draws(keys: Tensor, start: int, n: int, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal numbers [B, n, dim] for samples start..start+n-1 (Box-Muller).

    Word w of a sample gives coordinates w (radius * cos) and pairs + w (radius * sin).
    """
    pairs = (dim + 1) // 2
    out = torch.empty(keys.shape[0], n, 2 * pairs, dtype=dtype, device=keys.device)
    floats = _scratch("floats", keys.device)
    for points, samples, h, scratch in _hashed(keys, start, n, pairs):
        radius, angle = floats.get(h.shape, dtype, 2)
        torch.bitwise_right_shift(h, 32, out=scratch)
        scratch &= _LOW32
        _unit(scratch, radius).log_().mul_(-2.0).sqrt_()
        torch.bitwise_and(h, _LOW32, out=scratch)
        if dtype in _ANGLE_SCALE:
            _unit(scratch, angle, _ANGLE_SCALE[dtype])
        else:
            _unit(scratch, angle).mul_(2.0 * math.pi)
        block = out[points, samples]
        torch.cos(angle, out=block[..., :pairs]).mul_(radius)
        torch.sin(angle, out=block[..., pairs:]).mul_(radius)
    return out[..., :dim]


class Noise(ABC):
    """A zero-mean noise distribution over inputs of one shape."""

    #: True when the analytic estimators are exact for linear models under this noise.
    is_gaussian: bool = False

    @abstractmethod
    def sample(self, keys: Tensor, start: int, n: int, shape: torch.Size) -> Tensor:
        """Noise for samples ``start..start+n-1`` of each point.

        Args:
            keys: int64 [B] per-point keys from :func:`point_keys`.
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
        z = normal_draws(keys, start, n, d)
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
        u = uniform_draws(keys, start, n, math.prod(shape))
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
