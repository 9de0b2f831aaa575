"""The routes of Taylor and MMSE (probust.estimators.routes): each against every gradient taken
directly, the spectral screening's bound against simulation, and the cost rules."""

from __future__ import annotations

import math

import pytest
import torch
from scipy.stats import chi2
from torch import nn

import probust
from probust.estimators import pruning, routes
from probust.estimators.routes import ROUTE_NAMES
from probust.execution import costs
from tests._helpers import Tempered, linear_model


def _violations(spectrum: torch.Tensor, probes: int, failure: float, trials: int, seed: int) -> float:
    """The share of trials in which the bound lambda_max <= T / q fails, T the energy of
    ``probes`` standard normal probes under M = diag(spectrum) (any M is a rotation of it)."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(trials, probes, len(spectrum), generator=gen, dtype=torch.float64)
    energy = (w.square() * spectrum).sum((1, 2))
    bound = energy / pruning.variance_factor(probes, failure)
    return float((bound < spectrum.max()).double().mean())


@pytest.mark.parametrize("probes", [4, 8, 16])
def test_the_spectral_bound_fails_exactly_as_often_as_stated_for_a_rank_one_covariance(probes):
    # Rank one is the worst case: T / lambda_max is then exactly chi-square(m), so the failure
    # rate must equal the stated one (a q too small would fail more, one too large less).
    failure, trials = 0.05, 40_000
    rate = _violations(torch.tensor([3.0, 0.0, 0.0]), probes, failure, trials, seed=probes)
    allowance = 4 * (failure * (1 - failure) / trials) ** 0.5
    assert abs(rate - failure) <= allowance, rate
    assert pruning.variance_factor(probes, failure) == pytest.approx(chi2.ppf(failure, probes))


@pytest.mark.parametrize("spectrum", ["flat", "decaying", "two"])
def test_the_spectral_bound_fails_no_more_often_than_stated_for_any_spectrum(spectrum):
    values = {
        "flat": torch.ones(50),
        "decaying": 0.7 ** torch.arange(30.0),
        "two": torch.tensor([1.0, 0.9]),
    }[spectrum].double()
    failure, trials = 0.05, 40_000
    rate = _violations(values, routes.SPECTRAL_PROBES, failure, trials, seed=7)
    assert rate <= failure + 4 * (failure * (1 - failure) / trials) ** 0.5, rate


def test_spectral_lower_bounds_hold_on_linear_models():
    # A linear model is its own head (features: the input, J = I), so z is a closed form.
    # tol 1e-2: the mvn-cdf (p is not checked here) costs ~1 s instead of ~40 s, and the bound is
    # the tighter for it (a 100x larger failure share, so a larger q): more boundaries are dropped
    # (997 lower bounds at sigma 1 instead of 195), each bound closer to the exact z.
    # "near": inputs and biases scaled by sigma, so that z is spread as at sigma 1 and some
    # boundaries are kept at every sigma (at sigma 0.05 and 0.2 the unscaled points drop all).
    lower_bounds = exact = 0
    for seed, sigma, near in ((0, 0.05, False), (1, 0.2, False), (0, 0.05, True), (1, 0.2, True), (2, 1.0, True)):
        model = linear_model(30, 200, seed=seed)
        x = torch.randn(16, 30, generator=torch.Generator().manual_seed(seed))
        if near:  # at sigma 1: the points as they are
            with torch.no_grad():
                model.bias.mul_(sigma)
            x = x * sigma
        r = probust.Taylor(model, sigma, route="spectral", tol=1e-2)(x)
        w, b = model.weight.double(), model.bias.double()
        logits = x.double() @ w.T + b
        c = logits.gather(1, r.target[:, None]) - logits
        z = c / (sigma * (w[r.target][:, None] - w[None]).norm(dim=2))
        z.scatter_(1, r.target[:, None], torch.inf)
        dropped = torch.isnan(r.grad_norm)
        assert (r.z[dropped] <= z[dropped] * (1 + 1e-6)).all()
        kept = torch.isfinite(r.grad_norm) & torch.isfinite(z)
        torch.testing.assert_close(r.z[kept], z[kept], rtol=1e-5, atol=0)
        assert dropped.sum() >= 900 and (not near or kept.sum() >= 1500), (sigma, near)  # the premise
        lower_bounds, exact = lower_bounds + int(dropped.sum()), exact + int(kept.sum())
    assert lower_bounds > 9000 and exact > 6000, (lower_bounds, exact)


def _trained_like(classes: int, near: int = 10, seed: int = 0) -> nn.Module:
    """A ReLU MLP whose first ``near`` logits are the same as its ``near``-class twin's and whose
    others sit 1,000 below (the head of a trained many-class model, where few classes compete)."""
    torch.manual_seed(seed)
    body = nn.Sequential(nn.Linear(30, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU())
    head = nn.Linear(128, classes)
    torch.manual_seed(seed + 1)
    twin = nn.Linear(128, near)
    with torch.no_grad():
        head.weight[:near] = twin.weight
        head.bias[:near] = twin.bias
        head.bias[near:] -= 1000.0
    return nn.Sequential(body, head).eval(), nn.Sequential(body, twin).eval()


@pytest.mark.parametrize("make", [probust.Taylor, lambda *a, **k: probust.MMSE(*a, n_samples=4, **k)])
def test_far_classes_cost_nothing_and_change_nothing(make):
    many, few = _trained_like(1000)
    x = torch.randn(8, 30, generator=torch.Generator().manual_seed(3))
    sigma = 0.5
    big, small = make(many, sigma)(x), make(few, sigma)(x)
    assert (big.route == ROUTE_NAMES.index("candidates")).all()
    assert (big.boundaries_kept <= 9).all()
    assert torch.equal(big.target, small.target)
    assert ((small.p > 0.05) & (small.p < 0.95)).sum() >= 3, small.p  # the premise: p in mid-range
    # The far classes add nothing to p: the same problem up to both runs' stated errors (and the
    # float rounding of margins read off logits of different heads).
    assert ((big.p - small.p).abs() <= big.cdf_error + small.cdf_error + 1e-6).all()


@pytest.mark.parametrize("route", ["direct", "head", "spectral", "candidates-of-sketch"])
def test_mmse_with_more_copies_than_a_pass_holds(route):
    # 6 copies per point, 4 rows per pass: every pull runs its forward passes again, block by block.
    model = linear_model(30, 120, seed=5)
    if route == "candidates-of-sketch":
        model, route = Tempered(model), "sketch"
    x = torch.randn(5, 30, generator=torch.Generator().manual_seed(4)) * 0.1
    full = probust.MMSE(model, 0.05, n_samples=6, prune="off", batch_size=4)(x)
    got = probust.MMSE(model, 0.05, n_samples=6, batch_size=4, route=route)(x)
    assert torch.equal(got.target, full.target)
    assert ((got.p - full.p).abs() <= got.cdf_error + full.cdf_error + 1e-6).all()
    # Whole points per pass (batch_size >= copies): the same numbers.
    whole = probust.MMSE(model, 0.05, n_samples=6, batch_size=12, route=route)(x)
    torch.testing.assert_close(whole.p, got.p, rtol=0, atol=1e-6)


def test_the_forward_route_is_every_gradient_by_forward_mode():
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 50)).eval())
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(0))
    full = probust.Taylor(model, 0.3, cdf="mv-sigmoid", prune="off", jacobian="loop")(x)
    forward = probust.Taylor(model, 0.3, cdf="mv-sigmoid", route="forward")(x)
    assert (forward.route == ROUTE_NAMES.index("forward")).all()
    torch.testing.assert_close(forward.grad_norm, full.grad_norm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(forward.p, full.p, rtol=1e-5, atol=1e-7)


def test_few_inputs_and_many_classes_take_forward_mode_or_the_sketch_by_measured_cost():
    # 6 inputs, 400 classes, no head: 6 forward-mode products give every gradient, far cheaper
    # than 399 backward passes; the route is read off the measured costs, in a call large enough
    # to repay measuring them. Forward mode's one-time start-up (torch._dynamo's import) paid
    # already, as in any process that used it once.
    import torch._dynamo  # noqa: F401

    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 400)).eval())
    x = torch.randn(300, 6, generator=torch.Generator().manual_seed(0))
    r = probust.Taylor(model, 0.02, jacobian="loop")(x)
    assert (r.route != ROUTE_NAMES.index("direct")).all()
    full = probust.Taylor(model, 0.02, prune="off", jacobian="loop")(x[:8])
    assert ((r.p[:8] - full.p).abs() <= r.cdf_error[:8] + full.cdf_error + 1e-6).all()


def test_forward_mode_is_not_timed_where_its_start_up_would_cost_more_than_the_planning_share(monkeypatch):
    monkeypatch.setattr(costs, "torch_func_startup", lambda: 2.5)  # as in a process that never used it
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 400)).eval())
    x = torch.randn(3, 6)
    plan = probust.Taylor(model, 0.3, jacobian="loop")._jacobian_plan(x, 3)
    calls = []
    original = costs.Pullback
    monkeypatch.setattr(costs, "Pullback", lambda *a, **k: calls.append(1) or original(*a, **k))
    small = costs.unit_costs(model, None, x, plan, work=3 * 399)
    assert small.jvp == float("inf")  # forward mode left out: seconds of imports for a tiny call
    reverse_passes = len(calls)
    large = costs.unit_costs(model, None, x, plan, work=1e9)  # forward mode not cached above: timed now
    assert large.jvp < float("inf")
    assert len(calls) == reverse_passes  # the reverse-mode costs were kept, not timed again
    assert (large.forward, large.pull) == (small.forward, small.pull)


def test_measured_pass_costs_are_kept_per_model(monkeypatch):
    calls = []
    original = costs.Pullback
    monkeypatch.setattr(costs, "Pullback", lambda *a, **k: calls.append(1) or original(*a, **k))
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 400)).eval())
    x = torch.randn(3, 6)
    plan = probust.Taylor(model, 0.3, jacobian="loop")._jacobian_plan(x, 3)
    first = costs.unit_costs(model, None, x, plan, work=1e9, forward_mode=True)
    measured = len(calls)
    second = costs.unit_costs(model, None, x, plan, work=1e9, forward_mode=True)
    assert measured > 0 and len(calls) == measured and first == second
    assert first.forward > 0 and first.pull > 0 and 0 < first.jvp < float("inf")


@pytest.mark.parametrize("strategy", ["loop", "vmap"])
def test_a_pulls_cost_is_timed_on_the_cotangents_a_pass_really_runs(monkeypatch, strategy):
    # vmap pads every pull to VMAP_STEP cotangents: timing two would charge the padding to them.
    from probust.execution.tuning import JacobianPlan
    from probust.pullback import VMAP_STEP

    asked = []
    original = costs.Pullback

    class Recording(original):  # type: ignore[misc, valid-type]
        def pull(self, cotangents):
            asked.append(cotangents.shape[0])
            return super().pull(cotangents)

    monkeypatch.setattr(costs, "Pullback", Recording)
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 400)).eval())
    plan = JacobianPlan(strategy, 4, None, False)
    measured = costs.unit_costs(model, None, torch.randn(3, 6), plan, work=10.0)
    if strategy == "vmap":  # a full step, then the loop's own pulls to compare with
        assert asked[0] == VMAP_STEP and set(asked) == {VMAP_STEP, 2}
        assert 0 < measured.loop_pull < float("inf")
    else:
        assert set(asked) == {2} and measured.loop_pull == measured.pull
    assert 0 < measured.forward < float("inf") and 0 < measured.pull < float("inf")


def test_the_routes_pull_with_vmap_only_where_it_pays_for_its_padding():
    from probust.execution.tuning import JacobianPlan

    vmap, loop = JacobianPlan("vmap", 4, None, False), JacobianPlan("loop", 4, None, False)
    tie = costs.UnitCosts(forward=1.0, pull=0.12, jvp=math.inf, loop_pull=0.12)  # ViT on this CPU
    cheap = costs.UnitCosts(forward=1.0, pull=0.05, jvp=math.inf, loop_pull=0.12)
    assert routes.pull_strategy(vmap, tie) == "loop" and tie.route_pull == 0.12
    assert routes.pull_strategy(vmap, cheap) == "vmap" and cheap.route_pull == 0.05
    assert routes.pull_strategy(vmap, None) == "vmap"  # nothing measured: the plan's strategy
    assert routes.pull_strategy(loop, cheap) == "loop"
    # A forward-mode probe is counted in the pulls the routes really run.
    assert costs.UnitCosts(forward=1.0, pull=0.05, jvp=0.24, loop_pull=0.06).jvp_in_pulls == pytest.approx(4.0)


@pytest.mark.parametrize(("jvp_in_pulls", "sketched"), [(2.5, True), (3.2, False)])
def test_the_sketch_runs_where_both_screenings_fit_the_screening_share_of_the_best_route(
    monkeypatch, jvp_in_pulls, sketched
):
    # 400 inputs and 500 classes with no linear head: the direct route (499 pullbacks) is the
    # only exact one, and a flat random map defeats the spectral screening (it keeps all). The
    # sketch (32 probes) then runs where its probes and the spectral ones together cost at most
    # SCREENING_SHARE of 499: 8 + 32 * 2.5 = 88 <= 99.8 (though 80 is over RHO alone); 8 + 32 *
    # 3.2 = 110 is not. resnet50 at 224 x 224 sits in the first case (8 + 107 of 999).
    import torch._dynamo  # noqa: F401 - forward mode's start-up paid, as in a process that used it

    fixed = costs.UnitCosts(forward=1e-3, pull=1e-3, jvp=1e-3 * jvp_in_pulls, loop_pull=1e-3)
    monkeypatch.setattr(costs, "unit_costs", lambda *a, **k: fixed)
    monkeypatch.setattr(routes, "unit_costs", lambda *a, **k: fixed)
    model = Tempered(nn.Sequential(nn.Linear(400, 600), nn.Tanh(), nn.Linear(600, 500), nn.Tanh()).eval())
    x = torch.randn(3, 400, generator=torch.Generator().manual_seed(0))
    calls = []
    original = routes._sketch
    monkeypatch.setattr(routes, "_sketch", lambda *a, **k: calls.append(1) or original(*a, **k))
    r = probust.Taylor(model, 0.05, jacobian="loop")(x)
    assert bool(calls) == sketched
    assert routes.SPECTRAL_PROBES + pruning.PROBES * 2.5 <= routes.SCREENING_SHARE * 499 < pruning.PROBES * 3.2 + 8
    full = probust.Taylor(model, 0.05, prune="off", jacobian="loop")(x)
    assert ((r.p - full.p).abs() <= r.cdf_error + full.cdf_error + 1e-6).all()
