"""Plain Monte Carlo: p = k / n exactly, its seed, its interval and standard error, its adaptive mode."""

from __future__ import annotations

import torch
from torch import nn

import probust
from tests._helpers import linear_model, points_near_boundaries


class _Counting(nn.Module):
    """``inner``'s logits; counts the rows of every pass without autograd that differ from
    ``clean`` (the noisy copies) and, among them, those whose argmax is ``target``."""

    def __init__(self, inner: nn.Module, clean: torch.Tensor, target: int) -> None:
        super().__init__()
        self.inner, self.clean, self.target = inner, clean, target
        self.copies = self.kept = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits = self.inner(x)
        if not torch.is_grad_enabled():
            noisy = (x != self.clean).flatten(1).any(1)
            self.copies += int(noisy.sum())
            self.kept += int((noisy & (logits.argmax(1) == self.target)).sum())
        return logits


def test_mc_returns_exactly_k_over_n():
    # docs/estimate.md: p = k / n exactly, k the noisy copies whose prediction is the target, counted
    # here by the model itself as the estimator runs it (one point per call, so every copy is its own).
    model = linear_model(10, 3, seed=2)
    for i, x in enumerate(points_near_boundaries(model, 4, 0.5)):
        target = int(model(x[None]).argmax())
        counting = _Counting(model, x, target)
        r = probust.MonteCarlo(counting, 0.5, n_samples=777, seed=3)(x[None], torch.tensor([target]), index_offset=i)
        assert counting.copies == 777 and 0 < counting.kept < 777
        assert r.p.item() == counting.kept / 777  # float equality: the same division


def test_mc_interval_contains_p_with_ends_exactly_0_at_k_0_and_1_at_k_n():
    # Class 0's logit is 1 and class 2's is -1 wherever x is: every noisy copy is predicted 0.
    model = nn.Linear(4, 3)
    with torch.no_grad():
        model.weight.zero_()
        model.bias.copy_(torch.tensor([1.0, 0.0, -1.0]))
    x = torch.zeros(2, 4)
    for interval in ("wilson", "clopper-pearson"):
        survive = probust.MonteCarlo(model, 0.5, n_samples=50, interval=interval)(x, torch.tensor([0, 0]))
        fail = probust.MonteCarlo(model, 0.5, n_samples=50, interval=interval)(x, torch.tensor([2, 2]))
        assert (survive.p == 1).all() and (survive.ci_high == 1).all() and (survive.ci_low < 1).all()
        assert (fail.p == 0).all() and (fail.ci_low == 0).all() and (fail.ci_high > 0).all()
        mid = probust.MonteCarlo(linear_model(10, 3, seed=2), 0.5, n_samples=300, interval=interval)(
            points_near_boundaries(linear_model(10, 3, seed=2), 8, 0.5)
        )
        assert ((mid.ci_low <= mid.p) & (mid.p <= mid.ci_high)).all()


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


def test_a_float64_model_is_run_on_float64_copies_of_the_same_draws():
    # A float64 model used to fail (the noisy copies stayed float32: "mat1 and mat2 must have the
    # same dtype"); its copies are the same draws as mc_cv's, which were always float64 there.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)).double()
    x = torch.randn(4, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    mc = probust.MonteCarlo(model, 0.5, n_samples=300, seed=2)(x)
    cv = probust.MonteCarloCV(model, 0.5, n_samples=300, seed=2)(x)
    assert torch.equal(cv.p_mc, mc.p)
    assert ((mc.p > 0) & (mc.p < 1)).any(), mc.p
