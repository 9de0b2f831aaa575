"""The routes of Taylor and MMSE (probust.linearisation.routes): each against every gradient taken
directly, the spectral screening's bound against simulation, and the cost rules."""

from __future__ import annotations

import pytest
import torch
from scipy.stats import chi2
from torch import nn

import probust
from probust.errors import OptionError
from probust.execution import Execution
from probust.linearisation import counting as cost_model
from probust.linearisation import exact, routes
from probust.linearisation import pullback as gradients
from probust.linearisation import screening as pruning
from probust.linearisation.routes import FORCING, ROUTE_NAMES
from tests._helpers import Tempered, intel_cpu, linear_model


def _grams(spectrum: torch.Tensor, probes: int, trials: int, seed: int) -> torch.Tensor:
    """[trials, m, m]: the Gram matrices W^T M W of ``probes`` standard normal probes under
    M = diag(spectrum) (any M is a rotation of it), as the spectral screening pulls them back."""
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(trials, len(spectrum), probes, generator=gen, dtype=torch.float64)
    return w.transpose(1, 2) @ (spectrum[:, None] * w)


def _violations(spectrum: torch.Tensor, probes: int, failure: float, trials: int, seed: int) -> float:
    """The share of trials in which the screening's bound on lambda_max fails: the z lower bound
    of a boundary along M's top eigenvector (scale 1, margin 1) above its exact z."""
    gram = _grams(spectrum, probes, trials, seed)
    z_lower = pruning.spectral_z_lower(torch.ones(trials, 1), torch.ones(trials, 1), gram, failure)[:, 0]
    return float((z_lower > spectrum.max().rsqrt()).double().mean())


@pytest.mark.parametrize("probes", [4, 8, 16])
def test_the_spectral_bound_fails_exactly_as_often_as_stated_for_a_rank_one_covariance(probes):
    # Rank one is the worst case: G's top eigenvalue / lambda_max is then exactly chi-square(m),
    # so the failure rate must equal the stated one (a q too small would fail more, one too
    # large less).
    failure, trials = 0.05, 40_000
    rate = _violations(torch.tensor([3.0, 0.0, 0.0]).double(), probes, failure, trials, seed=probes)
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


@pytest.mark.parametrize("spectrum", ["flat", "decaying", "rank one"])
def test_the_spectral_bound_is_never_looser_than_the_probes_energy_and_m_times_tighter_on_a_flat_spectrum(
    spectrum,
):
    # lambda_max(G) <= tr(G), the probes' energy: the z bound from G's top eigenvalue is at least
    # the energy's (the statistic the screening used before), on every draw. On M spread over
    # d >> m directions (a backbone's 512 features), G ~ d I_m, so lambda_max(G) ~ tr(G) / m.
    values = {
        "flat": torch.ones(512),
        "decaying": 0.9 ** torch.arange(100.0),
        "rank one": torch.tensor([2.0, 0.0, 0.0]),
    }[spectrum].double()
    probes, failure = routes.SPECTRAL_PROBES, 1e-6
    gram = _grams(values, probes, 2_000, seed=3)
    energy = gram.diagonal(dim1=1, dim2=2).sum(1)
    margin, scale = torch.full((2_000, 1), 50.0), torch.full((2_000, 1), 2.0)
    z_lower = pruning.spectral_z_lower(margin, scale, gram, failure)[:, 0]
    z_energy = 50.0 / (2.0 * energy / pruning.variance_factor(probes, failure)).sqrt()
    assert (z_lower >= z_energy * (1 - 1e-12)).all()
    gain = float((z_lower / z_energy).square().median())
    expected = {"flat": (5.5, probes), "decaying": (2.5, 5.0), "rank one": (1.0, 1.0 + 1e-9)}[spectrum]
    assert expected[0] <= gain <= expected[1], gain


@pytest.mark.parametrize("spectrum", ["flat", "decaying", "rank one"])
def test_more_spectral_probes_never_give_more_than_the_stated_best(spectrum):
    # The later stage's bound from all 8 probes is at most pruning.spectral_z_best of the first
    # 4's (interlacing: the first probes' Gram is a principal submatrix), on every draw: a stage
    # skipped because that best could drop nothing would have dropped nothing.
    values = {"flat": torch.ones(512), "decaying": 0.9 ** torch.arange(100.0), "rank one": torch.tensor([2.0, 0.0])}[
        spectrum
    ].double()
    gram = _grams(values, 8, 2_000, seed=11)
    margin, scale = torch.full((2_000, 1), 50.0), torch.full((2_000, 1), 2.0)
    f1, f2 = pruning.spectral_stage_failure(1e-6, 0, 2), pruning.spectral_stage_failure(1e-6, 1, 2)
    z4 = pruning.spectral_z_lower(margin, scale, gram[:, :4, :4], f1)
    z8 = pruning.spectral_z_lower(margin, scale, gram, f2)
    best = pruning.spectral_z_best(z4, 4, f1, 8, f2)
    assert (z8 <= best * (1 + 1e-12)).all()
    assert float((z8 / best).max()) > 0.3  # not vacuous: the best is reached within a few times


def test_the_two_spectral_stages_fail_together_no_more_often_than_the_whole_share():
    # Rank one, the worst case: each stage's bound fails at exactly its part of the share, so the
    # union of both (what a point that runs both may use, z = the larger) fails at most at the sum.
    failure, trials = 0.05, 40_000
    gram = _grams(torch.tensor([1.0, 0.0]).double(), 8, trials, seed=5)
    margin, scale = torch.ones(trials, 1), torch.ones(trials, 1)
    z4 = pruning.spectral_z_lower(margin, scale, gram[:, :4, :4], pruning.spectral_stage_failure(failure, 0, 2))
    z8 = pruning.spectral_z_lower(margin, scale, gram, pruning.spectral_stage_failure(failure, 1, 2))
    first = float((z4[:, 0] > 1.0).double().mean())  # exact z: 1 / sqrt(1)
    rate = float((torch.maximum(z4, z8)[:, 0] > 1.0).double().mean())
    assert abs(first - 0.8 * failure) < 0.1 * 0.8 * failure, first  # the first stage at its part alone
    assert first <= rate <= failure * 1.05, rate
    assert pruning.spectral_stage_failure(failure, 0, 1) == failure


def _spectral_pulls(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """The probes each call of routes.spectral pulled per point, appended as the calls run."""
    used: list[int] = []
    original = routes.spectral

    def spy(*args, **kwargs):
        z, probes = original(*args, **kwargs)
        used.extend(int(v) for v in probes)
        return z, probes

    monkeypatch.setattr(routes, "spectral", spy)
    return used


@pytest.mark.parametrize(("far", "expected"), [(1000.0, 4), (0.0, 4)])
def test_the_spectral_screening_stops_after_its_first_stage_where_more_probes_could_drop_no_more(
    far, expected, monkeypatch
):
    # 300 classes through a 16-feature head. far = 1000: every class but 10 sits 1,000 logits
    # below, so the first 4 probes drop them all; far = 0: the classes compete and no bound from
    # any number of probes could drop them. Neither pays for the second stage.
    used = _spectral_pulls(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 300))
    with torch.no_grad():
        model[2].bias[10:] -= far
    x = torch.randn(6, 12, generator=torch.Generator().manual_seed(0))
    r = probust.Taylor(model, 0.05 if far else 3.0, prune="spectral", check_draws=0)(x)
    assert used == [expected] * 6
    if far:
        assert (r.boundaries_kept <= 9).all()
    else:
        assert (r.boundaries_kept >= 250).all()


def test_the_second_spectral_stage_runs_where_its_probes_could_drop_more_than_they_cost(monkeypatch):
    # Far classes (1,000 logits below) at a sigma where the first 4 probes' bounds cannot drop
    # them (about 1.4-2.7 here) but 8 probes' can (6.6-11): the second stage runs on every point,
    # and the far boundaries are dropped on its bounds, with no exact gradient.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 16), nn.Tanh(), nn.Linear(16, 300))
    x = torch.randn(6, 12, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        model[2].bias[10:] -= 1000.0
    bounds: list[torch.Tensor] = []
    original = routes.spectral

    def spy(*args, **kwargs):
        z, probes = original(*args, **kwargs)
        bounds.append(z)
        return z, probes

    monkeypatch.setattr(routes, "spectral", spy)
    _, threshold = pruning.shares(1e-4)
    monkeypatch.setitem(cost_model.SPECTRAL_STAGES, "cpu", (4,))
    probust.Taylor(model, 10.0, prune="spectral", check_draws=0)(x)
    assert float(bounds[-1][:, 10:].median()) < 4.0  # the premise: 4 probes alone leave most far classes
    monkeypatch.setitem(cost_model.SPECTRAL_STAGES, "cpu", (4, 8))
    used = _spectral_pulls(monkeypatch)
    r = probust.Taylor(model, 10.0, prune="spectral", check_draws=0)(x)
    assert used == [8] * 6
    far = r.z[:, 10:]
    assert bool(torch.isnan(r.grad_norm[:, 10:]).all()) and float(far.min()) > 5.0
    torch.testing.assert_close(far, bounds[-1][:, 10:], rtol=0, atol=0)  # dropped on the screening's bounds


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
        r = probust.Taylor(model, sigma, prune="spectral", tol=1e-2)(x)
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


@pytest.mark.parametrize("make", [probust.Taylor, lambda *a, **k: probust.MMSE(*a, n_samples=4, **k)])
@pytest.mark.parametrize("differentiable", [False, True])
def test_few_classes_take_every_gradient_through_the_routes_keeping_every_boundary(make, differentiable):
    # Where no screening or head pays (C = 10, a head of 32 features), and wherever the graph is
    # kept, the routes take every margin's gradient from the logits and keep every boundary: the
    # margins and z of torch.func's own Jacobian of the copies, averaged, to float rounding.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(12, 32), nn.Tanh(), nn.Linear(32, 10)).eval()
    x = torch.randn(16, 12, generator=torch.Generator().manual_seed(1))
    sigma = 0.5
    est = make(model, sigma, differentiable=differentiable, execution=Execution(jacobian="loop", batch_size=8))
    ctx = est.route_context(x)
    assert not ctx.prune and ctx.gradients == "direct" and ctx.head is None
    assert ctx.differentiable == differentiable
    got = est(x)
    assert (got.route == ROUTE_NAMES.index("direct")).all() and (got.boundaries_kept == 9).all()
    assert ((got.p > 0.05) & (got.p < 0.95)).sum() >= 3, got.p  # the premise: p in mid-range
    assert got.p.requires_grad == differentiable

    copies = est._copies(x, torch.arange(len(x)))  # [B, N, 12]: the point itself, or MMSE's copies
    with torch.no_grad():
        logits = model(copies)  # [B, N, C]
    jacobian = torch.func.vmap(torch.func.vmap(torch.func.jacrev(model)))(copies)  # [B, N, C, 12]
    target = got.target
    row = torch.arange(len(x))
    margin = (logits[row, :, target][..., None] - logits).mean(1)
    normal = (jacobian[row, :, target][:, :, None] - jacobian).mean(1)  # [B, C, 12]
    z = margin.double() / (sigma * normal.double().norm(dim=2))
    z[row, target] = torch.inf
    torch.testing.assert_close(got.margin.detach(), margin, rtol=0, atol=1e-6)
    torch.testing.assert_close(got.z.detach(), z, rtol=1e-5, atol=1e-6)
    if differentiable:  # the same numbers with the graph kept as without it
        plain = make(model, sigma, execution=Execution(jacobian="loop", batch_size=8))(x)
        torch.testing.assert_close(got.p.detach(), plain.p, rtol=0, atol=0)


@pytest.mark.parametrize("batch_size", [1, 5, 100])
@pytest.mark.parametrize("source", [("loop", "auto"), ("vmap", "auto"), ("auto", "forward")])
@pytest.mark.parametrize("differentiable", [False, True])
def test_mmse_linearisation_is_the_mean_of_its_copies_linearisations(source, batch_size, differentiable):
    # Every boundary's margin and gradient averaged over the copies, whatever the rows per pass
    # (1: each copy in a pass of its own, its graph kept per pass where differentiable) and the
    # gradients' source: what mc_cv and mc_is take (Linearised.linearise).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 5)).double().eval()
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    jacobian, gradients = source
    est = probust.MMSE(
        model,
        0.3,
        n_samples=4,
        differentiable=differentiable,
        gradients=gradients,
        execution=Execution(batch_size=batch_size, jacobian=jacobian),
    )
    indices = torch.arange(3)
    with torch.no_grad():
        target = model(x).argmax(1)
    got = est.linearise(x, None, indices)
    assert torch.equal(got.target, target)
    assert got.margin.requires_grad == got.normal.requires_grad == differentiable
    copies = est._copies(x, indices)  # [3, 4, 6]
    with torch.no_grad():
        logits = model(copies)
    jacobian = torch.func.vmap(torch.func.vmap(torch.func.jacrev(model)))(copies)  # [3, 4, 5, 6]
    row = torch.arange(3)
    margin = (logits[row, :, target][..., None] - logits).mean(1)
    normal = (jacobian[row, :, target][:, :, None] - jacobian).mean(1)
    torch.testing.assert_close(got.margin.detach(), margin, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.normal.detach(), normal, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("route", ["direct", "head", "spectral", "candidates-of-sketch"])
def test_mmse_with_more_copies_than_a_pass_holds(route):
    # 6 copies per point, 4 rows per pass: every pull runs its forward passes again, block by block.
    model = linear_model(30, 120, seed=5)
    if route == "candidates-of-sketch":
        model, route = Tempered(model), "sketch"
    x = torch.randn(5, 30, generator=torch.Generator().manual_seed(4)) * 0.1
    full = probust.MMSE(model, 0.05, n_samples=6, prune="off", execution=Execution(batch_size=4))(x)
    got = probust.MMSE(model, 0.05, n_samples=6, execution=Execution(batch_size=4), **FORCING[route])(x)
    assert torch.equal(got.target, full.target)
    assert ((got.p - full.p).abs() <= got.cdf_error + full.cdf_error + 1e-6).all()
    # Whole points per pass (batch_size >= copies): the same numbers.
    whole = probust.MMSE(model, 0.05, n_samples=6, execution=Execution(batch_size=12), **FORCING[route])(x)
    torch.testing.assert_close(whole.p, got.p, rtol=0, atol=1e-6)


def test_the_forward_route_is_every_gradient_by_forward_mode():
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 50)).eval())
    x = torch.randn(7, 6, generator=torch.Generator().manual_seed(0))
    full = probust.Taylor(model, 0.3, cdf="mv-sigmoid", prune="off", execution=Execution(jacobian="loop"))(x)
    forward = probust.Taylor(model, 0.3, cdf="mv-sigmoid", gradients="forward")(x)
    assert (forward.route == ROUTE_NAMES.index("forward")).all()
    torch.testing.assert_close(forward.grad_norm, full.grad_norm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(forward.p, full.p, rtol=1e-5, atol=1e-7)


def test_few_inputs_and_many_classes_take_forward_mode_by_counts():
    # 6 inputs, 400 classes, no head: 6 forward-mode probes at the declared cost (1.5 pulls each
    # on a CPU) give every gradient, far cheaper than 399 backward passes; nothing is timed.
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 400)).eval())
    x = torch.randn(300, 6, generator=torch.Generator().manual_seed(0))
    r = probust.Taylor(model, 0.02, execution=Execution(jacobian="loop"))(x)
    assert 6 * cost_model.jvp_in_pulls(x.device) < 399
    assert (r.route == ROUTE_NAMES.index("forward")).all()
    full = probust.Taylor(model, 0.02, prune="off", execution=Execution(jacobian="loop"))(x[:8])
    assert ((r.p[:8] - full.p).abs() <= r.cdf_error[:8] + full.cdf_error + 1e-6).all()


def test_a_model_forward_mode_cannot_run_through_takes_the_reverse_routes(monkeypatch):
    """Forward mode's availability is one untimed probe per model: where torch says it cannot run
    (CPU flash attention has no forward-mode formula), the sketch and the forward route are left
    out; a forced one is refused; an error that is not torch.func's propagates."""
    model = Tempered(nn.Sequential(nn.Linear(6, 32), nn.Tanh(), nn.Linear(32, 400)).eval())
    x = torch.randn(4, 6, generator=torch.Generator().manual_seed(0))

    def no_formula(*args, **kwargs):
        raise NotImplementedError("Trying to use forward AD with _flash_attention that does not support it")

    monkeypatch.setattr(gradients.forward_mode, "jvps", no_formula)
    assert not gradients.forward_mode_runs(model, x)
    r = probust.Taylor(model, 0.02, execution=Execution(jacobian="loop"))(x)
    assert not (r.route == ROUTE_NAMES.index("forward")).any()
    with pytest.raises(OptionError, match="cannot run through this model"):
        probust.Taylor(model, 0.02, prune="sketch")(x)

    def bug(*args, **kwargs):
        raise TypeError("unsupported operand type(s) for +: 'Tensor' and 'NoneType'")

    other = Tempered(nn.Sequential(nn.Linear(6, 400)).eval())
    monkeypatch.setattr(gradients.forward_mode, "jvps", bug)
    with pytest.raises(TypeError, match="unsupported operand"):
        gradients.forward_mode_runs(other, x)


def test_the_routes_are_decided_before_any_timing(monkeypatch):
    """Which gradients are taken comes from counts and the plans are declared: with the clock
    raising, the default plan gives each point the route and the numbers of a fixed plan."""
    import time

    model, _ = _trained_like(400, near=10)
    x = torch.randn(6, 30, generator=torch.Generator().manual_seed(3))
    before = probust.Taylor(model, 0.5, execution=Execution(jacobian="loop", batch_size=8))(x)

    def no_clock():
        raise AssertionError("a clock was read while deciding what to compute")

    fresh, _ = _trained_like(400, near=10)
    monkeypatch.setattr(time, "perf_counter", no_clock)
    after = probust.Taylor(fresh, 0.5)(x)
    assert torch.equal(after.route, before.route)
    torch.testing.assert_close(after.p, before.p, rtol=0, atol=1e-6)


def _record_pulls(monkeypatch) -> list:
    """(strategy, cotangents, chunk_size, pad) of every Pullback pull the routes make; a
    margin_jacobian call, a path the routes do not run, fails."""
    from probust.linearisation.pullback import VMAP_STEP, Pullback

    pulled: list = []

    class Recording(Pullback):
        def __init__(self, model, rows, head, *, strategy="loop", fallback=True, differentiable=False):
            super().__init__(model, rows, head, strategy=strategy, fallback=fallback, differentiable=differentiable)
            self.strategy = str(strategy)

        def pull(self, cotangents, *, chunk_size=VMAP_STEP, pad=True):
            pulled.append((self.strategy, cotangents.shape[0], chunk_size, pad))
            return super().pull(cotangents, chunk_size=chunk_size, pad=pad)

    def imitation(*args, **kwargs):
        raise AssertionError("the routes ran a Jacobian path they do not run")

    monkeypatch.setattr(exact, "Pullback", Recording)
    monkeypatch.setattr(exact, "margin_jacobian", imitation)
    return pulled


@pytest.mark.parametrize("jacobian", ["auto", "vmap"])
def test_the_routes_pull_by_the_declared_plan_padded_to_a_step(monkeypatch, jacobian):
    """Planning runs nothing: the routes' plan is the loop on a CPU (or the user's vmap), and the
    routes pull boundary cotangents on the head's features by it, padded to a step as every
    narrow pull is."""
    pulled = _record_pulls(monkeypatch)
    torch.manual_seed(0)
    # The head route (33 pulls) beats the direct one (399), and 450 inputs keep the plan off forward mode.
    model = nn.Sequential(nn.Linear(450, 32), nn.ReLU(), nn.Linear(32, 400)).eval()
    x = torch.randn(80, 450, generator=torch.Generator().manual_seed(1))
    est = probust.Taylor(model, 0.05, check_draws=0, execution=Execution(jacobian=jacobian))
    ctx = est.route_context(x)
    assert not ctx.every_boundary and not pulled  # planned without a pass
    assert ctx.plan.strategy == ("loop" if jacobian == "auto" else "vmap")
    r = est(x[:2])
    assert set(ROUTE_NAMES[i] for i in r.route.tolist()) == {"head"}
    assert pulled and {(strategy, pad) for strategy, _, _, pad in pulled} == {(jacobian.replace("auto", "loop"), True)}


def test_every_gradients_plan_pulls_every_boundary_in_its_class_chunks_unpadded(monkeypatch):
    """Where the routes take every boundary's gradient (C = 10), they pull the C - 1 boundaries
    in the plan's class chunks, unpadded, never by another path."""
    pulled = _record_pulls(monkeypatch)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(450, 32), nn.Tanh(), nn.Linear(32, 10)).eval()
    x = torch.randn(80, 450, generator=torch.Generator().manual_seed(1))
    est = probust.Taylor(model, 0.05, check_draws=0)
    ctx = est.route_context(x)
    assert ctx.every_boundary and ctx.head is None and not pulled
    r = est(x[:2])
    assert (r.route == ROUTE_NAMES.index("direct")).all()
    assert {(strategy, width, chunk, pad) for strategy, width, chunk, pad in pulled} == {
        (str(ctx.plan.strategy), 9, ctx.plan.class_chunk, False)
    }


def test_a_routed_plan_takes_forward_mode_only_where_the_forward_route_is_the_cheapest():
    # 64 inputs and 400 classes: forward mode's 96 probes beat the direct route's 399 pulls but not
    # the head route's 33, so no point takes forward mode and the plan must not be one (its pulls
    # would run by the loop, untimed). Without the head (Tempered), forward mode is the cheapest.
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 400)).eval()
    x = torch.randn(8, 64, generator=torch.Generator().manual_seed(1))
    ctx = probust.Taylor(model, 0.05).route_context(x)
    assert ctx is not None and ctx.plan.strategy in ("loop", "vmap")
    forced = probust.Taylor(model, 0.05, gradients="forward").route_context(x)
    assert forced is not None and forced.plan.strategy == "forward"
    headless = probust.Taylor(Tempered(model), 0.05).route_context(x)
    assert headless is not None and headless.head is None and headless.plan.strategy == "forward"


@pytest.mark.parametrize(("planned", "pulls"), [("loop", "loop"), ("vmap", "vmap"), ("forward", "loop")])
def test_the_routes_pull_by_their_plans_strategy(planned, pulls):
    from probust.linearisation import JacobianPlan
    from probust.noise import as_noise

    ctx = routes.Context(
        model=nn.Linear(3, 4),
        head=None,
        plan=JacobianPlan(planned, 4, None, False),
        noise=as_noise(0.1),
        tol=1e-4,
        seed=0,
        prune=True,
        jvp=1.5,
        share=0.5,
        probe_rows=8,
        pull_rows=4,
        graph_rows=4,
    )
    assert ctx.pull == pulls


def test_the_screening_share_is_declared_per_device_kind():
    # On CUDA a forward-mode pass costs torch.func's per-layer Python work, which the counts do not
    # see, while batched pulls are cheap: a smaller share keeps the sketch to where it saves more.
    assert cost_model.SCREENING_SHARE == {"cpu": 0.5, "cuda": 0.2}
    assert cost_model.screening_share(torch.device("cuda", 0)) == 0.2
    assert cost_model.screening_share("cpu") == 0.5
    assert cost_model.screening_share("mps") == 0.5  # a kind with no figure of its own: the CPU's


def _flat_map() -> nn.Module:
    # 400 inputs and 500 classes with no linear head: the direct route (499 pullbacks) is the only
    # exact one, and a flat random map defeats the spectral screening (it keeps all 499).
    torch.manual_seed(0)
    return Tempered(nn.Sequential(nn.Linear(400, 600), nn.Tanh(), nn.Linear(600, 500), nn.Tanh()).eval())


def _record_sketch(monkeypatch) -> tuple[list[tuple[int, int, list[int]]], list[list[int]]]:
    """(each sketch stage's (first probe, stop, its points' indices), each selection's kept counts
    in the order the routes made them: the spectral screening's, then each stage's, then the last)."""
    stages: list[tuple[int, int, list[int]]] = []
    kept: list[list[int]] = []
    sketch, drop = pruning._sketch, pruning.drop

    def recorded_sketch(ctx, copies, target, indices, first, stop):
        stages.append((first, stop, indices.tolist()))
        return sketch(ctx, copies, target, indices, first, stop)

    def recorded_drop(*args, **kwargs):
        out = drop(*args, **kwargs)
        kept.append(out.kept.tolist())
        return out

    monkeypatch.setattr(pruning, "_sketch", recorded_sketch)
    monkeypatch.setattr(pruning, "drop", recorded_drop)  # the sketch's stages
    monkeypatch.setattr(routes, "drop", recorded_drop)  # the spectral screening's and the last
    return stages, kept


@pytest.mark.parametrize(
    ("jvp_in_pulls", "device_kind", "sketched"), [(7.6, "cpu", True), (7.7, "cpu", False), (7.6, "cuda", False)]
)
def test_the_sketch_runs_where_both_screenings_fit_the_screening_share_of_the_best_route(
    monkeypatch, jvp_in_pulls, device_kind, sketched
):
    # The spectral screening keeps all 499 after its first stage's 4 probes, and no bound from 8
    # could drop any (so its second stage does not run), so the sketch runs where its worst case
    # (every stage: 32 probes) and those 4 probes together cost at most the device's screening
    # share of 499: on the CPU (0.5) 4 + 32 * 7.6 = 247.2 <= 249.5 and 4 + 32 * 7.7 = 250.4 is not;
    # at CUDA's share (0.2, run here on the CPU) 247.2 > 99.8. resnet50 at 224 x 224 sits in the
    # first case on the CPU (4 + 32 * 1.5 of 999). Where it runs, its first stage takes every point.
    monkeypatch.setitem(cost_model.JVP_IN_PULLS, "cpu", jvp_in_pulls)
    monkeypatch.setitem(cost_model.SCREENING_SHARE, "cpu", cost_model.screening_share(device_kind))
    model = _flat_map()
    x = torch.randn(3, 400, generator=torch.Generator().manual_seed(0))
    stages, kept = _record_sketch(monkeypatch)
    r = probust.Taylor(model, 0.05, execution=Execution(jacobian="loop"))(x)
    assert kept[0] == [499] * 3  # the premise: the spectral screening keeps all
    assert stages[:1] == ([(0, 8, [0, 1, 2])] if sketched else [])
    share = cost_model.screening_share(device_kind)
    spent = cost_model.spectral_stages("cpu")[0]
    assert (spent + pruning.PROBES * jvp_in_pulls <= share * 499) == sketched
    full = probust.Taylor(model, 0.05, prune="off", execution=Execution(jacobian="loop"))(x)
    assert ((r.p - full.p).abs() <= r.cdf_error + full.cdf_error + 1e-6).all()


@pytest.mark.parametrize(("sigma", "last_stop"), [(0.02, 16), (0.03, 32)])
def test_each_sketch_stage_runs_where_its_new_probes_cost_less_than_the_candidates_left(monkeypatch, sigma, last_stop):
    # At the declared CPU cost (1.5 pulls a probe; share 0.5 of 499 = 249.5 admits the whole
    # sketch's 8 + 48 pulls), a stage runs on a point where its new probes cost fewer pulls than the
    # candidates the stages before left: 16 * 1.5 = 24 pulls for the third stage. At sigma 0.02 the
    # first two stages leave fewer than 24 on every point, so its probes 16-31 are never drawn; at
    # 0.03 four of the six points are left with more, and only they take the third stage.
    model = _flat_map()
    x = torch.randn(6, 400, generator=torch.Generator().manual_seed(0))
    stages, kept = _record_sketch(monkeypatch)
    r = probust.Taylor(model, sigma, check_draws=0, execution=Execution(jacobian="loop"))(x)
    assert max(stop for _, stop, _ in stages) == last_stop
    done, ran = 0, list(range(6))
    for stage, (first, stop, points) in enumerate(stages):
        cost = (stop - first) * cost_model.JVP_IN_PULLS["cpu"]
        left = kept[stage]  # the spectral screening's, then each stage's kept counts
        assert first == done
        assert points == [i for i in ran if cost < left[i]], (stage, left)
        done, ran = stop, points
    assert len(stages[-1][2]) < 6 or last_stop == 16  # a later stage skips points where it cannot pay
    full = probust.Taylor(model, sigma, prune="off", check_draws=0, execution=Execution(jacobian="loop"))(x)
    assert ((r.p - full.p).abs() <= r.cdf_error + full.cdf_error + 1e-6).all()


def test_a_points_sketch_stages_and_numbers_do_not_depend_on_the_batch_split(monkeypatch):
    # At sigma 0.03 the third stage runs on some of the points only (the test above), so in each
    # part of a split a point's forward-mode passes hold other rows than in the whole batch: its
    # stages must be the same (they are decided by its counts), and on Intel its z and p the
    # same bits. Elsewhere rows of passes of a few rows round differently whatever the route
    # (prune="off" as well, measured on an AMD EPYC: p by up to 2.5e-6 through the mvn-cdf's
    # adaptive sampling), so p agrees within the stated errors.
    model = _flat_map()
    x = torch.randn(6, 400, generator=torch.Generator().manual_seed(0))
    stages, _ = _record_sketch(monkeypatch)
    estimator = probust.Taylor(model, 0.03, check_draws=0, execution=Execution(jacobian="loop", batch_size=8))
    whole = estimator(x)
    together = {first: points for first, _, points in stages}
    assert 0 < len(together[16]) < 6  # the premise: the last stage takes some points, not all
    for k in (2, 3, 4):
        stages.clear()
        parts = probust.Estimate.cat([estimator(x[:k]), estimator(x[k:], index_offset=k)])
        apart: dict[int, list[int]] = {}
        for first, _, points in stages:
            apart.setdefault(first, []).extend(points)
        assert {first: sorted(points) for first, points in apart.items()} == together, k
        assert torch.equal(parts.boundaries_kept, whole.boundaries_kept), k
        if intel_cpu():
            assert torch.equal(parts.p, whole.p) and torch.equal(parts.z, whole.z), k
        else:
            assert ((parts.p - whole.p).abs() <= parts.cdf_error + whole.cdf_error).all(), k
