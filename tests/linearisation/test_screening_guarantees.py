"""What the screenings promise, each term on its own: the failure probability of a screening is
counted in ``cdf_error`` (not hidden under a comparison's slack), and the sketch's lower bounds
hold together, over every boundary, at the stated level (a union over the C - 1 boundaries).

The pruned-against-full comparisons elsewhere allow 1e-6 of float slack, which at the default
tol 1e-4 is exactly the screening's failure share (FAILURE_SHARE * tol): they cannot see that
term go missing. Here the problems are built so that every other part of ``cdf_error`` is zero
(one kept boundary: a closed form, error 0; the other boundaries 1,000 logits away: tails 0), so
the failure share is all that is left, at two tolerances.
"""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2, norm
from torch import nn

import probust
from probust.linearisation import screening as pruning
from probust.linearisation.routes import ROUTE_NAMES
from probust.mvn.numerics import ndtr


def _two_near_classes(d: int = 30, classes: int = 200) -> tuple[nn.Linear, torch.Tensor]:
    """A linear model whose classes 0 and 1 compete and whose others sit 1,000 logits below, and
    points on a segment across the boundary of 0 and 1 (p from ~0.3 to ~0.7 at sigma 0.1)."""
    gen = torch.Generator().manual_seed(0)
    model = nn.Linear(d, classes)
    with torch.no_grad():
        model.weight.copy_(torch.randn(classes, d, generator=gen))
        model.bias.zero_()
        model.bias[2:] = -1000.0
    w = (model.weight[0] - model.weight[1]).detach().double()
    x = (w / w.square().sum())[None].float() * (torch.linspace(-0.3, 0.3, 7)[:, None] + 0.01)
    return model, x


@pytest.mark.parametrize("route", ["spectral", "sketch"])
@pytest.mark.parametrize("method", ["taylor", "mmse"])
def test_a_screened_points_cdf_error_holds_the_screenings_failure_share(method, route):
    model, x = _two_near_classes()
    sigma = 0.1
    w, b = model.weight.detach().double(), model.bias.detach().double()
    for tol in (1e-4, 1e-2):  # failure shares 1e-6 (the comparisons' slack) and 1e-4
        make = probust.Taylor if method == "taylor" else lambda *a, **k: probust.MMSE(*a, n_samples=4, **k)
        r = make(model, sigma, tol=tol, prune=route)(x)
        # The premise: every point screened, one boundary kept (a closed form with no error).
        assert (r.route == ROUTE_NAMES.index("candidates")).all()
        assert (r.boundaries_kept == 1).all()
        # The error holds the dropped tails and the screening's failure probability; the whole
        # stays within tol (what pruning reserves of it).
        dropped = torch.isnan(r.grad_norm)
        tails = torch.where(dropped, ndtr(-r.z), 0.0).sum(1)
        share = pruning.FAILURE_SHARE * tol
        assert (r.cdf_error >= tails + share).all(), (tol, r.cdf_error, share)
        assert (r.cdf_error <= tol).all(), (tol, r.cdf_error)
        # The oracle: a linear model's p is Phi(z) of its one near boundary (the others' tails
        # are below 1e-300). + 1e-7: the margins are float32 logits (measured up to 4.4e-8 off).
        logits = x.double() @ w.T + b
        other = 1 - r.target
        c = logits.gather(1, r.target[:, None])[:, 0] - logits.gather(1, other[:, None])[:, 0]
        z = c / (sigma * (w[r.target] - w[other]).norm(dim=1))
        exact = torch.from_numpy(norm.cdf(z.numpy()))
        assert ((r.p - exact).abs() <= r.cdf_error - share + 1e-7).all(), (r.p - exact, r.cdf_error)


#: Probes per simulated sketch: the bound holds at any count; 8 keeps the simulations small.
PROBES = 8


def _sketch_failure_rate(scales: torch.Tensor, mixing: float, failure: float, trials: int, seed: int) -> float:
    """The share of trials in which any of the sketch's lower bounds on z exceeds the true z.

    Boundary i (column i + 1; column 0 is the target) has s_i = scales[i] and margin 1 (true z
    1 / s_i); its probe derivatives d_ik = u_i . v_k (k < PROBES) are N(0, s_i^2), independent
    over probes k and, with ``mixing`` 0,
    independent over boundaries (the worst case of the union bound); ``mixing`` in (0, 1) gives
    them a common part (correlated boundaries, as of a trained model).
    """
    gen = torch.Generator().manual_seed(seed)
    k = len(scales)
    own = torch.randn(trials, PROBES, k, generator=gen, dtype=torch.float64)
    common = torch.randn(trials, PROBES, 1, generator=gen, dtype=torch.float64)
    d = ((1 - mixing**2) ** 0.5 * own + mixing * common) * scales
    derivatives = torch.cat([torch.zeros(trials, PROBES, 1, dtype=torch.float64), d], dim=2)
    margin = torch.cat([torch.zeros(trials, 1), torch.ones(trials, k)], dim=1).double()
    z_lower = pruning.sketch_z_lower(margin, derivatives, failure)[:, 1:]
    return float((z_lower > 1.0 / scales).any(1).double().mean())


@pytest.mark.parametrize("classes", [2, 11, 51])
def test_the_sketch_bounds_fail_together_as_often_as_stated_for_independent_boundaries(classes):
    # Independent boundaries: the bounds fail together with probability 1 - (1 - f / (C - 1))^(C - 1)
    # (each fails with f / (C - 1), the chi-square's quantile), just below f. A bound without its
    # union over the boundaries fails with 1 - (1 - f)^(C - 1): 0.40 at C = 11, 0.92 at C = 51.
    # The allowance is 5 binomial standard deviations (a false failure in ~1 of 1.7 million runs).
    failure, trials = 0.05, 20_000
    scales = torch.linspace(0.5, 2.0, classes - 1, dtype=torch.float64)
    rate = _sketch_failure_rate(scales, 0.0, failure, trials, seed=classes)
    stated = 1 - (1 - failure / (classes - 1)) ** (classes - 1)
    allowance = 5 * (stated * (1 - stated) / trials) ** 0.5
    assert abs(rate - stated) <= allowance, (rate, stated)
    assert stated <= failure * (1 + 1e-12)


@pytest.mark.parametrize("mixing", [0.5, 0.95])
def test_the_sketch_bounds_fail_no_more_often_than_stated_for_correlated_boundaries(mixing):
    failure, trials, classes = 0.05, 20_000, 31
    scales = torch.linspace(0.5, 2.0, classes - 1, dtype=torch.float64)
    rate = _sketch_failure_rate(scales, mixing, failure, trials, seed=int(100 * mixing))
    assert rate <= failure + 5 * (failure * (1 - failure) / trials) ** 0.5, rate


@pytest.mark.parametrize("classes", [2, 31])
def test_the_staged_sketchs_bounds_fail_together_no_more_often_than_the_sketchs_share(classes):
    # Every stage runs (the worst case: a point's z lower bound is the largest of its stages'),
    # each on the first SKETCH_STAGES[s] probes at stage_failure(f, s); the union over the stages
    # keeps the whole sketch within f. 5 binomial standard deviations.
    failure, trials = 0.05, 20_000
    gen = torch.Generator().manual_seed(classes)
    scales = torch.linspace(0.5, 2.0, classes - 1, dtype=torch.float64)
    d = torch.randn(trials, pruning.PROBES, classes - 1, generator=gen, dtype=torch.float64) * scales
    derivatives = torch.cat([torch.zeros(trials, pruning.PROBES, 1, dtype=torch.float64), d], dim=2)
    margin = torch.cat([torch.zeros(trials, 1), torch.ones(trials, classes - 1)], dim=1).double()
    each = [
        pruning.sketch_z_lower(margin, derivatives[:, :m], pruning.stage_failure(failure, stage))[:, 1:]
        for stage, m in enumerate(pruning.SKETCH_STAGES)
    ]
    rate = float((torch.stack(each).amax(0) > 1.0 / scales).any(1).double().mean())
    parts = [pruning.stage_failure(failure, stage) for stage in range(len(pruning.SKETCH_STAGES))]
    assert sum(parts) == pytest.approx(failure, rel=1e-12)
    assert rate <= failure + 5 * (failure * (1 - failure) / trials) ** 0.5, rate
    # Not vacuous: each stage alone fails about as often as its part (the bounds are tight), so
    # the whole is near the sum where the stages' failures rarely coincide.
    for stage, z_lower in enumerate(each):
        alone = float((z_lower > 1.0 / scales).any(1).double().mean())
        assert alone >= 0.5 * parts[stage], (stage, alone)


def test_the_sketch_bound_is_the_chi_square_quantile_at_the_failure_shared_over_the_boundaries():
    # The closed form: z_lower_i = c_i / sqrt(sum_k d_ik^2 / q), q the chi-square(m) quantile at
    # failure / (C - 1), for C = 2, 7 and 1000 (one boundary: no union to take).
    gen = torch.Generator().manual_seed(0)
    for classes, failure in ((2, 1e-6), (7, 1e-3), (1000, 1e-6)):
        derivatives = torch.randn(3, pruning.PROBES, classes, generator=gen, dtype=torch.float64)
        margin = torch.rand(3, classes, generator=gen, dtype=torch.float64) + 0.1
        q = chi2.ppf(failure / (classes - 1), pruning.PROBES)
        expected = margin / (derivatives.square().sum(1) / q).sqrt()
        torch.testing.assert_close(pruning.sketch_z_lower(margin, derivatives, failure), expected, rtol=1e-12, atol=0)
