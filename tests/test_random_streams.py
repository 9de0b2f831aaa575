"""The counter-based random streams: exact integers, split-invariant, and the documented laws."""

from __future__ import annotations

import math

import pytest
import torch

from probust import noise

MASK = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


def _splitmix_finaliser(x: int) -> int:
    """splitmix64's finaliser on Python ints: the oracle for the int64 torch version."""
    x = ((x ^ (x >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    x = ((x ^ (x >> 27)) * 0x94D049BB133111EB) & MASK
    return x ^ (x >> 31)


def _oracle_normal(key: int, sample: int, dim: int) -> list[float]:
    """Box-Muller from the documented counters, in float64 Python arithmetic."""
    pairs = (dim + 1) // 2
    out = [0.0] * (2 * pairs)
    for w in range(pairs):
        h = _splitmix_finaliser((key + (sample * pairs + w + 1) * GOLDEN) & MASK)
        u1 = ((h >> 32) + 0.5) * 2.0**-32
        u2 = ((h & 0xFFFFFFFF) + 0.5) * 2.0**-32
        radius, angle = math.sqrt(-2.0 * math.log(u1)), 2.0 * math.pi * u2
        out[w], out[pairs + w] = radius * math.cos(angle), radius * math.sin(angle)
    return out[:dim]


@pytest.mark.parametrize("start,n,dim", [(0, 3, 5), (17, 2, 784), (1000, 1, 1)])
def test_bits_equal_splitmix64_on_python_integers(start, n, dim):
    keys = noise.point_keys(7, torch.tensor([0, 5, 123456]), noise.STREAM_MC)
    bits = noise._bits(keys, start, n, dim)
    for b, key in enumerate(keys.tolist()):
        for s in range(n):
            for w in range(dim):
                expected = _splitmix_finaliser((key + ((start + s) * dim + w + 1) * GOLDEN) & MASK)
                assert bits[b, s, w].item() & MASK == expected


@pytest.mark.parametrize("dim", [1, 6, 785])
def test_normal_matches_box_muller_oracle(dim):
    keys = noise.point_keys(3, torch.arange(4), noise.STREAM_MMSE)
    got = noise.normal_draws(keys, 11, 3, dim, dtype=torch.float64)
    for b, key in enumerate(keys.tolist()):
        for s in range(3):
            expected = torch.tensor(_oracle_normal(key & MASK, 11 + s, dim), dtype=torch.float64)
            # float64 u's from the same 32-bit integers: only log/cos rounding can differ.
            torch.testing.assert_close(got[b, s], expected, rtol=1e-12, atol=1e-12)


def test_draws_do_not_depend_on_how_points_and_samples_are_split():
    keys = noise.point_keys(0, torch.arange(9), noise.STREAM_MC)
    whole = noise.normal_draws(keys, 0, 300, 785)
    pieces = torch.cat([noise.normal_draws(keys, 0, 37, 785), noise.normal_draws(keys, 37, 263, 785)], dim=1)
    assert torch.equal(whole, pieces)
    assert torch.equal(whole[4:5], noise.normal_draws(keys[4:5], 0, 300, 785))
    uniform = noise.uniform_draws(keys, 5, 200, 13, torch.float64)
    assert torch.equal(uniform[:, 100:], noise.uniform_draws(keys, 105, 100, 13, torch.float64))


def test_blocks_larger_than_the_cache_chunk_give_the_same_numbers(monkeypatch):
    keys = noise.point_keys(1, torch.arange(3), noise.STREAM_MC)
    reference = noise.normal_draws(keys, 0, 64, 100)
    monkeypatch.setattr(noise, "_CHUNK_WORDS", 37)  # forces many small, unaligned blocks
    assert torch.equal(noise.normal_draws(keys, 0, 64, 100), reference)


def test_normal_and_uniform_have_their_laws():
    keys = noise.point_keys(2, torch.arange(20), noise.STREAM_MC)
    z = noise.normal_draws(keys, 0, 5000, 8).double().flatten()  # 800,000 draws
    assert abs(z.mean().item()) < 5 * 1 / math.sqrt(z.numel())
    assert abs(z.var().item() - 1) < 5 * math.sqrt(2 / z.numel())
    assert abs((z < -1.0).double().mean().item() - 0.158655) < 5 * math.sqrt(0.16 * 0.84 / z.numel())
    u = noise.uniform_draws(keys, 0, 5000, 8, torch.float64).flatten()
    assert 0 < u.min().item() and u.max().item() < 1
    assert abs(u.mean().item() - 0.5) < 5 * math.sqrt(1 / 12 / u.numel())


def test_streams_and_seeds_are_independent():
    index = torch.arange(4)
    a = noise.normal_draws(noise.point_keys(0, index, noise.STREAM_MC), 0, 100, 10).flatten().double()
    b = noise.normal_draws(noise.point_keys(0, index, noise.STREAM_MMSE), 0, 100, 10).flatten().double()
    c = noise.normal_draws(noise.point_keys(1, index, noise.STREAM_MC), 0, 100, 10).flatten().double()
    for other in (b, c):
        correlation = torch.corrcoef(torch.stack([a, other]))[0, 1].item()
        assert abs(correlation) < 5 / math.sqrt(a.numel())


def test_every_stream_has_its_own_keys():
    # A purpose's draws must not repeat another's (CERTIFY's selection and estimation draws are
    # independent only because their streams differ): distinct constants, distinct keys.
    streams = {name: value for name, value in vars(noise).items() if name.startswith("STREAM_")}
    assert len(set(streams.values())) == len(streams), streams
    index = torch.arange(50)
    keys = torch.stack([noise.point_keys(0, index, stream) for stream in streams.values()])
    assert keys.flatten().unique().numel() == keys.numel()


def test_buffers_kept_between_calls_serve_calls_in_and_out_of_inference_mode():
    keys = noise.point_keys(3, torch.arange(4), noise.STREAM_MC)
    reference = noise.normal_draws(keys, 7, 50, 301)
    with torch.inference_mode():  # the kept buffers and counter tables are made here first
        noise._THREAD.__dict__.clear()
        inside = noise.normal_draws(keys, 7, 50, 301)
    outside = noise.normal_draws(keys, 7, 50, 301)  # and written to here, outside inference mode
    assert torch.equal(inside, reference) and torch.equal(outside, reference)


def test_threads_drawing_at_once_get_the_numbers_of_one_thread():
    import concurrent.futures

    keys = [noise.point_keys(seed, torch.arange(3), noise.STREAM_MC) for seed in range(8)]
    serial = [noise.normal_draws(k, 5 * i, 200, 600) for i, k in enumerate(keys)]
    with concurrent.futures.ThreadPoolExecutor(4) as pool:
        parallel = list(pool.map(lambda ik: noise.normal_draws(ik[1], 5 * ik[0], 200, 600), enumerate(keys)))
    assert all(torch.equal(a, b) for a, b in zip(serial, parallel, strict=True))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_normal_is_bitwise_the_step_by_step_box_muller_of_the_bits(dtype):
    # The fused conversions (int64 + 0.5 in one pass, 2 pi * 2**-32 in one multiplication) must
    # give exactly the floats of converting, adding 0.5, scaling by 2**-32 and then by 2 pi.
    keys = noise.point_keys(11, torch.arange(3), noise.STREAM_MC)
    pairs = 300
    h = noise._bits(keys, 40, 70, pairs)
    high, low = (h >> 32) & 0xFFFFFFFF, h & 0xFFFFFFFF

    def unit(bits):
        out = torch.empty(bits.shape, dtype=dtype)
        out.copy_(bits)
        out += 0.5
        out *= 2.0**-32
        return out

    radius = unit(high).log_().mul_(-2.0).sqrt_()
    angle = unit(low).mul_(2.0 * math.pi)
    expected = torch.cat([torch.cos(angle) * radius, torch.sin(angle) * radius], dim=-1)
    assert torch.equal(noise.normal_draws(keys, 40, 70, 2 * pairs, dtype=dtype), expected)
