"""The guarantee of CERTIFY and of its sequential form, by simulation where p is exact.

For a linear classifier with two classes t and o, the noisy copies keep class t with probability
p = Phi(m / (sigma ||w_t - w_o||)), m = f_t(x) - f_o(x); its smoothed classifier is itself, and
the true radius at x is the distance to its boundary, |m| / ||w_t - w_o||. A point certified
with class c at radius r is wrong when c is not the class of p > 1/2 or r exceeds that distance.
The guarantee: for each point, P(wrong) <= alpha; over many independent points (each index has
its own random streams) the share of wrong certificates is at most alpha, up to a binomial
allowance. The points sit where it is hardest: just inside each radius asked for (p just below
Phi(r / sigma)), and just across the boundary.
"""

from __future__ import annotations

import pytest
import torch
from scipy import stats
from torch import Tensor, nn

import probust
from probust.execution import Execution
from tests._helpers import linear_model

SIGMA = 0.5
RADII = (0.0, 0.25, 0.5)
SETTINGS = dict(execution=Execution(memory_budget="512MB", channels_last=False, batch_size=4096))


def _points_at(model: nn.Linear, distances: Tensor, seed: int = 1) -> Tensor:
    """Random points moved along w_0 - w_1 to the signed distance given (> 0: class 0's side)."""
    w = (model.weight[0] - model.weight[1]).detach()
    b = (model.bias[0] - model.bias[1]).detach()
    x = torch.randn(len(distances), w.numel(), generator=torch.Generator().manual_seed(seed))
    margin = x @ w + b
    return x + ((distances * w.norm() - margin) / w.norm() ** 2)[:, None] * w


def _truth(model: nn.Linear, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """(smoothed class, true radius, p of class 0) from the closed form."""
    w = (model.weight[0] - model.weight[1]).detach()
    margin = x @ w + (model.bias[0] - model.bias[1]).detach()
    p0 = torch.special.ndtr(margin.double() / (SIGMA * w.norm().double()))
    return (margin < 0).long(), (margin.abs() / w.norm()).double(), p0


def _hard_points(model: nn.Linear, repeats: int) -> Tensor:
    # just inside each radius (p 0.005 sigma short of Phi(r / sigma)), and just across the boundary
    eps = 0.005 * SIGMA
    distances = torch.tensor([r - eps for r in RADII if r > 0] + [eps, -eps])
    return _points_at(model, distances.repeat(repeats))


def _allowance(trials: int, alpha: float) -> float:
    """The most wrong certificates a share alpha allows, but for a 1e-4 chance."""
    return float(stats.binom.ppf(1 - 1e-4, trials, alpha))


def _wrong_fixed(model: nn.Linear, x: Tensor, r: probust.CertifyResult) -> Tensor:
    c, radius, _ = _truth(model, x)
    return ~r.abstained & ((r.prediction != c) | (r.radius > radius))


def _wrong_sequential(model: nn.Linear, x: Tensor, r: probust.CertifyResult) -> Tensor:
    """bool [B, R + 1]: wrong at each radius asked for, and the radius reported wrong."""
    c, radius, _ = _truth(model, x)
    assert r.certified is not None
    wrong_class = (r.prediction != c)[:, None]
    wrong_at = r.certified & (wrong_class | (torch.tensor(RADII, dtype=torch.float64)[None, :] > radius[:, None]))
    wrong_radius = ~r.abstained & ((r.prediction != c) | (r.radius > radius))
    return torch.cat([wrong_at, wrong_radius[:, None]], dim=1)


def test_the_closed_form_is_the_models_probability():
    # The oracle itself, against Monte Carlo with a 99.9% interval.
    model = linear_model(5, 2)
    x = _hard_points(model, 1)
    _, _, p0 = _truth(model, x)
    mc = probust.MonteCarlo(model, SIGMA, n_samples=20_000, confidence=0.999, **SETTINGS)(x, torch.zeros(len(x)).long())
    assert ((mc.ci_low <= p0) & (p0 <= mc.ci_high)).all(), (mc.p, p0)


def test_certify_is_wrong_for_at_most_alpha_of_points():
    alpha, repeats = 0.05, 800
    model = linear_model(5, 2)
    x = _hard_points(model, repeats)
    r = probust.certify(model, x, SIGMA, n0=100, n=500, alpha=alpha, seed=3, **SETTINGS)
    wrong = _wrong_fixed(model, x, r)
    assert wrong.sum().item() <= _allowance(len(x), alpha), wrong.double().mean()
    # and the simulation has points to be wrong about: most of them are certified at all
    assert (~r.abstained).double().mean() > 0.5


@pytest.mark.parametrize("procedure", ["sequential", "prior"])
@pytest.mark.parametrize("futility", [0.001, 0.5])
def test_sequential_certify_is_wrong_for_at_most_alpha_of_points_whenever_it_stops(futility, procedure):
    # futility = 0.5 gives radii up early and so stops points at other times: the guarantee
    # does not depend on when a point stops.
    alpha, repeats = 0.05, 500
    model = linear_model(5, 2)
    x = _hard_points(model, repeats)
    r = probust.certify(
        model,
        x,
        SIGMA,
        n0=100,
        n=1500,
        alpha=alpha,
        radii=RADII,
        futility=futility,
        procedure=procedure,
        seed=4,
        **SETTINGS,
    )
    wrong = _wrong_sequential(model, x, r)
    allowance = _allowance(len(x), alpha)
    for j in range(wrong.shape[1]):
        assert wrong[:, j].sum().item() <= allowance, (j, wrong[:, j].double().mean())
    # every certificate of a point right at once, with probability 1 - alpha
    assert wrong.any(dim=1).sum().item() <= allowance, wrong.any(dim=1).double().mean()
    assert (r.n_drawn < 100 + 1500).any()  # points did stop early


@pytest.mark.slow
@pytest.mark.parametrize(
    ("radii", "n", "repeats"),
    [
        pytest.param(None, 2000, 8000, marks=pytest.mark.slow(seconds=14)),
        pytest.param(RADII, 4000, 6000, marks=pytest.mark.slow(seconds=22)),
    ],
)
def test_the_guarantee_at_alpha_001_over_many_points(radii, n, repeats):
    alpha = 0.01
    model = linear_model(8, 2, seed=5)
    x = _hard_points(model, repeats)
    r = probust.certify(model, x, SIGMA, n0=100, n=n, alpha=alpha, radii=radii, seed=9, **SETTINGS)
    wrong = _wrong_fixed(model, x, r) if radii is None else _wrong_sequential(model, x, r).any(dim=1)
    assert wrong.sum().item() <= _allowance(len(x), alpha), wrong.double().mean()
