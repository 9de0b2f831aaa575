"""Plain Monte Carlo: its seed, its interval and standard error, its adaptive mode."""

from __future__ import annotations

import torch

import probust
from tests._helpers import linear_model, points_near_boundaries


def test_seed_changes_the_noise_and_fixes_it():
    model = linear_model(10, 3, seed=2)
    x = points_near_boundaries(model, 5, 0.5)
    a = probust.MonteCarlo(model, 0.5, n_samples=500, seed=1)(x).p
    b = probust.MonteCarlo(model, 0.5, n_samples=500, seed=1)(x).p
    c = probust.MonteCarlo(model, 0.5, n_samples=500, seed=2)(x).p
    assert torch.equal(a, b)
    assert not torch.equal(a, c)


def test_monte_carlo_interval_and_stderr():
    model = linear_model(10, 3, seed=2)
    x = points_near_boundaries(model, 5, 0.5)
    r = probust.MonteCarlo(model, 0.5, n_samples=2000, confidence=0.9)(x)
    assert r.confidence == 0.9
    assert (r.ci_low <= r.p).all() and (r.p <= r.ci_high).all()
    torch.testing.assert_close(r.stderr, torch.sqrt(r.p * (1 - r.p) / 2000))
    assert (r.n_samples == 2000).all()


def test_adaptive_monte_carlo_stops_each_point_at_its_target_width():
    model = linear_model(10, 3, seed=2)
    x = torch.cat([points_near_boundaries(model, 3, 0.5), 20 * torch.ones(1, 10)])
    r = probust.MonteCarlo(model, 0.5, n_samples=50_000, target_half_width=0.01, check_every=500)(x)
    half = (r.ci_high - r.ci_low) / 2
    assert (half <= 0.01).all()
    assert r.n_samples.min() < r.n_samples.max() <= 50_000
    assert (r.n_samples % 500 == 0).all()
