"""Scrambled Sobol' points: range, determinism, addressing by index, and the net structure that a
linear matrix scrambling plus a digital shift preserves.

Why the structure survives: point n of a Sobol' sequence has digits C_j g(n) in coordinate j (C_j
upper triangular with unit diagonal, g the Gray code, which maps every aligned block of 2^m
indices onto an aligned block). The scrambling multiplies by a lower-triangular unit-diagonal
matrix L_j and adds a digital shift, so the first d output digits of coordinate j are a bijective
affine function of the first d digits of C_j g(n). Hence (a) in every coordinate, each aligned
block of 2^m points puts exactly one point in each cell [a/2^m, (a+1)/2^m); (b) the first two
coordinates (van der Corput and the Pascal matrix: a (0, 2)-sequence) keep their (0, m, 2)-net
property. Nothing is asserted for other pairs of coordinates (their t-value is not 0).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from probust.mvn.sobol import sobol_points


def _points(seed: int = 0, replicates: int = 4, start: int = 0, stop: int = 1 << 12, dim: int = 40) -> np.ndarray:
    return sobol_points(seed, replicates, start, stop, dim).numpy()


def test_points_are_float64_coordinate_major_and_strictly_inside_the_unit_cube():
    w = sobol_points(3, 4, 0, 4096, 70)
    assert w.dtype == torch.float64 and w.shape == (70, 4, 4096)
    assert (w > 0).all() and (w < 1).all()


def test_empty_ranges_give_empty_arrays():
    assert sobol_points(0, 3, 5, 5, 4).shape == (4, 3, 0)
    assert sobol_points(0, 3, 0, 8, 0).shape == (0, 3, 8)


def test_same_seed_gives_bitwise_the_same_points():
    a = _points(seed=7)
    b = _points(seed=7)
    assert np.array_equal(a.view(np.int64), b.view(np.int64))


def test_other_seeds_and_other_replicates_give_other_points():
    a, b = _points(seed=0), _points(seed=1)
    assert np.mean(a == b) < 1e-3
    for r in range(1, a.shape[1]):
        assert np.mean(a[:, 0] == a[:, r]) < 1e-3, r


def test_a_slice_equals_the_same_rows_of_the_sequence_from_zero():
    full = _points(seed=5, stop=1200, dim=35)
    for start, stop in [(0, 1), (1, 2), (5, 37), (512, 1024), (1000, 1100), (1023, 1025), (1199, 1200)]:
        part = _points(seed=5, start=start, stop=stop, dim=35)
        assert np.array_equal(part, full[:, :, start:stop]), (start, stop)


def test_a_coordinate_and_a_replicate_do_not_depend_on_how_many_are_asked_for():
    # The scrambling of a coordinate depends only on (seed, replicate, coordinate).
    big = _points(seed=2, replicates=5, start=100, stop=300, dim=70)
    for dim in (1, 3, 32, 33, 64):
        for replicates in (1, 2):
            small = _points(seed=2, replicates=replicates, start=100, stop=300, dim=dim)
            assert np.array_equal(small, big[:dim, :replicates]), (dim, replicates)


@pytest.mark.parametrize("seed", [0, 11])
def test_every_coordinate_is_stratified_by_every_aligned_block_of_2_pow_m_points(seed):
    w = _points(seed=seed, dim=70)  # coordinates in three scrambling blocks of 32
    d, r, n = w.shape
    for m in range(0, 13):
        cells = np.floor(w * 2.0**m).astype(np.int64).reshape(d, r, n >> m, 1 << m)
        assert (np.sort(cells, axis=-1) == np.arange(1 << m)).all(), m


def test_stratification_holds_for_a_block_that_does_not_start_at_zero():
    # points 3 * 2^8 .. 4 * 2^8 - 1 form one aligned block of 2^8
    w = _points(seed=4, start=768, stop=1024, dim=10)
    cells = np.floor(w * 256.0).astype(np.int64)
    assert (np.sort(cells, axis=-1) == np.arange(256)).all()


@pytest.mark.parametrize("seed", [0, 9])
def test_first_two_coordinates_form_a_0_m_2_net(seed):
    # Every elementary box of area 2^-m, [a 2^-d1, (a+1) 2^-d1) x [b 2^-d2, (b+1) 2^-d2) with
    # d1 + d2 = m, holds exactly one of the first 2^m points.
    w = _points(seed=seed, dim=2)
    for rep in range(w.shape[1]):
        x, y = w[0, rep], w[1, rep]
        for m in range(0, 12):
            n = 1 << m
            for d1 in range(m + 1):
                d2 = m - d1
                a = np.floor(x[:n] * 2.0**d1).astype(np.int64)
                b = np.floor(y[:n] * 2.0**d2).astype(np.int64)
                counts = np.bincount(a * (1 << d2) + b, minlength=n)
                assert (counts == 1).all(), (rep, m, d1)


@pytest.mark.parametrize("seed", [0, 1])
def test_a_smooth_integral_converges_far_faster_than_monte_carlo(seed):
    # f(u) = prod_j e^{u_j} / (e - 1) on [0, 1]^5 integrates to 1. Plain Monte Carlo with
    # n = 4096 points has standard error sqrt(((e + 1) / (2 (e - 1)))^5 - 1) / 64 ~ 0.011; a
    # scrambled net's error of a smooth integrand falls like n^-1.5 up to log factors, so the
    # root-mean-square error over the replicates must be at least 20 times smaller.
    d, n = 5, 4096
    w = _points(seed=seed, replicates=8, stop=n, dim=d)
    f = np.prod(np.exp(w) / (math.e - 1.0), axis=0)  # [replicates, n]
    rmse = math.sqrt(np.mean((f.mean(-1) - 1.0) ** 2))
    mc_se = math.sqrt(((math.e + 1) / (2 * (math.e - 1))) ** d - 1) / math.sqrt(n)
    assert rmse < mc_se / 20, (rmse, mc_se)
