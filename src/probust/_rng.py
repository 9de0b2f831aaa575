"""Counter-based random numbers: a point's noise is a pure function of (seed, point index, stream).

`torch.Generator` streams depend on the order of draws, so a point's noise would change with
batch size, order and resumption, and differ between CPU and CUDA. Instead every random number
is ``splitmix64(key + counter * golden)``, where ``key`` is derived from (seed, point index,
stream) and ``counter`` enumerates (sample, coordinate). The same integers come out on any
device, in any chunking, so estimates are reproducible value for value.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor


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


def _bits(keys: Tensor, start: int, n: int, width: int) -> Tensor:
    """64 random bits for counters [start, start + n) x [0, width): int64 [B, n, width]."""
    device = keys.device
    counter = (
        torch.arange(start, start + n, device=device, dtype=torch.int64)[:, None] * width
        + torch.arange(width, device=device, dtype=torch.int64)[None, :]
    )
    state = keys[:, None, None] + (counter[None] + 1) * _GOLDEN
    return _mix(state)


def uniform(keys: Tensor, start: int, n: int, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Uniform(0, 1) numbers, open interval: [B, n, dim] for samples start..start+n-1."""
    pairs = (dim + 1) // 2
    h = _bits(keys, start, n, pairs)
    # Two 32-bit uniforms per 64-bit word; +0.5 keeps them strictly inside (0, 1).
    hi = (_shift_right(h, 32).to(torch.float64) + 0.5) * 2.0**-32
    lo = ((h & 0xFFFFFFFF).to(torch.float64) + 0.5) * 2.0**-32
    return torch.cat([hi, lo], dim=-1)[..., :dim].to(dtype)


def normal(keys: Tensor, start: int, n: int, dim: int, dtype: torch.dtype = torch.float32) -> Tensor:
    """Standard normal numbers [B, n, dim] for samples start..start+n-1 (Box-Muller)."""
    pairs = (dim + 1) // 2
    h = _bits(keys, start, n, pairs)
    u1 = (_shift_right(h, 32).to(dtype) + 0.5) * 2.0**-32
    u2 = ((h & 0xFFFFFFFF).to(dtype) + 0.5) * 2.0**-32
    radius = torch.sqrt(-2.0 * torch.log(u1))
    angle = (2.0 * math.pi) * u2
    return torch.cat([radius * torch.cos(angle), radius * torch.sin(angle)], dim=-1)[..., :dim]
