"""Randomised quasi-Monte Carlo points for :mod:`probust.mvn`: scrambled Sobol' sequences.

Each replicate is a Sobol' sequence (Joe-Kuo direction numbers, as shipped with
:class:`torch.quasirandom.SobolEngine`) under its own random linear matrix scrambling and
digital shift (Owen 1998, Matousek 1998), so replicates are independent and each is an unbiased
estimator with a QMC convergence rate; the spread across replicates gives the error estimate.
The scrambling keeps the digital net structure of the sequence: every aligned block of 2^m
points stratifies each coordinate into 2^m equal cells.

The scrambling of a coordinate depends only on ``(seed, replicate, coordinate)``, and a point is
addressed by its index: the points a problem sees never depend on the batch around it (why not
``SobolEngine(scramble=True)``: docs/mvn.md).
"""

from __future__ import annotations

import functools
from typing import cast

import numpy as np
import torch
from torch import Tensor

__all__ = ["BITS", "sobol_points"]

BITS = 30  # digits of the direction numbers shipped with torch
_BLOCK = 32  # coordinates whose scrambling is drawn together (from their own generator)
_MAX_DIM = torch.quasirandom.SobolEngine.MAXDIM


@functools.lru_cache(maxsize=8)
def _direction_numbers(dim: int) -> np.ndarray:
    """Unscrambled direction numbers [dim, BITS] (int64; bit BITS-1-i is digit i+1)."""
    if dim > _MAX_DIM:
        raise ValueError(f"Sobol' points are available for at most {_MAX_DIM} dimensions, got {dim}")
    return torch.quasirandom.SobolEngine(dim).sobolstate.numpy().copy()


@functools.lru_cache(maxsize=64)
def _scrambled_block(seed: int, replicate: int, block: int) -> tuple[np.ndarray, np.ndarray]:
    """Scrambled direction numbers [_BLOCK, BITS] and digital shifts [_BLOCK] of one block."""
    first = block * _BLOCK
    v = _direction_numbers(min(first + _BLOCK, _MAX_DIM))[first:]
    n = v.shape[0]
    rng = np.random.default_rng([seed, replicate, block, 0x50B01])
    # Lower-triangular with unit diagonal: output digit i depends on input digits <= i.
    lower = np.tril(rng.integers(0, 2, (n, BITS, BITS)), -1) + np.eye(BITS, dtype=np.int64)
    shift = cast(np.ndarray, rng.integers(0, 1 << BITS, n))
    weights = 1 << np.arange(BITS - 1, -1, -1, dtype=np.int64)  # digit i -> bit BITS-1-i
    digits = (v[:, :, None] >> np.arange(BITS - 1, -1, -1)) & 1  # [n, column, digit]
    mixed = np.einsum("dij,dcj->dci", lower, digits) % 2
    return (mixed * weights).sum(-1), shift


def _scrambled(seed: int, replicate: int, dim: int) -> tuple[np.ndarray, np.ndarray]:
    blocks = [_scrambled_block(seed, replicate, b) for b in range((dim + _BLOCK - 1) // _BLOCK)]
    v = np.concatenate([b[0] for b in blocks])[:dim]
    shift = np.concatenate([b[1] for b in blocks])[:dim]
    return v, shift


def _trailing_zeros(n: np.ndarray) -> np.ndarray:
    return np.log2(n & -n).astype(np.int64)


def sobol_points(seed: int, replicates: int, start: int, stop: int, dim: int) -> Tensor:
    """Points start..stop-1 of each replicate's scrambled sequence (in Gray-code order).

    Args:
        seed: fixes the scrambling of every replicate.
        replicates: independent scramblings 0, ..., replicates - 1.
        start, stop: point indices; any range gives the same points as those rows of ``0:stop``.
        dim: coordinates, at most ``torch.quasirandom.SobolEngine.MAXDIM`` (ValueError beyond).

    Returns:
        float64 [dim, replicates, stop - start], coordinate-major (the integrand reads one
        coordinate of all points at a time). Coordinates are centred in their cell of width
        2^-BITS, so they lie strictly inside (0, 1).
    """
    n = stop - start
    out = np.empty((dim, replicates, max(n, 0)), dtype=np.float64)
    if n <= 0 or dim == 0:
        return torch.from_numpy(out)
    gray = start ^ (start >> 1)
    first_bits = ((gray >> np.arange(BITS)) & 1).astype(bool)
    step_bits = _trailing_zeros(np.arange(start + 1, stop, dtype=np.int64))
    for r in range(replicates):
        v, shift = _scrambled(seed, r, dim)
        x = np.empty((dim, n), dtype=np.int64)
        x[:, 0] = np.bitwise_xor.reduce(v[:, first_bits], axis=1) if first_bits.any() else 0
        # Gray-code order: point m differs from point m-1 by one direction number.
        x[:, 1:] = v[:, step_bits]
        np.bitwise_xor.accumulate(x, axis=1, out=x)
        out[:, r] = ((x ^ shift[:, None]) + 0.5) * 2.0**-BITS
    return torch.from_numpy(out)
