"""Pruning the decision boundaries of Taylor and MMSE: the sketch's bound against exact z
(linear models, where z is a closed form), and pruned p against unpruned p within the bound."""

from __future__ import annotations

import functools
import warnings

import pytest
import torch
from torch import nn

import probust
from probust.execution import Execution
from probust.linearisation import counting as cost_model
from probust.linearisation import screening as pruning
from probust.linearisation.margins import margin_sketch
from probust.linearisation.routes import FORCING, ROUTE_NAMES
from probust.mvn.numerics import ndtr
from probust.noise import STREAM_PRUNE, Gaussian, point_keys
from tests._helpers import Tempered, linear_model


def _exact_z(model: nn.Linear, x: torch.Tensor, sigma: float) -> tuple[torch.Tensor, torch.Tensor]:
    """(target [B], z [B, C]) of a linear model in float64: c_i / (sigma ||W_t - W_i||), +inf at t."""
    w, b = model.weight.double(), model.bias.double()
    logits = x.double() @ w.T + b
    t = logits.argmax(1)
    c = logits.gather(1, t[:, None]) - logits
    norm = (w[t][:, None, :] - w[None]).norm(dim=2)
    z = (c / (sigma * norm)).scatter(1, t[:, None], torch.inf)
    return t, z


def _select(model: nn.Module, x: torch.Tensor, target: torch.Tensor, sigma: float, tol: float, seed: int):
    keys = point_keys(seed, torch.arange(len(x)), STREAM_PRUNE)
    probes = Gaussian(sigma).sample(keys, 0, pruning.PROBES, x.shape[1:])
    margin, derivatives = margin_sketch(model, x[:, None], target, probes, batch_size=len(x))
    return _sketch_select(margin, derivatives, target, tol=tol)


def _sketch_select(
    margin: torch.Tensor, derivatives: torch.Tensor, target: torch.Tensor, *, tol: float
) -> pruning.Pruned:
    """The sketch's bounds and the drop in one step, as the routes run them on a sketched point:
    margins [B, C], probe derivatives [B, m, C], the failure and drop shares of ``tol``."""
    budget, delta = pruning.shares(tol)
    return pruning.drop(pruning.sketch_z_lower(margin, derivatives, delta), target, budget=budget, delta=delta)


def _exact_select(margin: torch.Tensor, variance: torch.Tensor, target: torch.Tensor, *, tol: float) -> pruning.Pruned:
    """The drop from exact z (the head route's case): no screening, so no failure probability."""
    return pruning.drop(pruning.exact_z(margin, variance), target, budget=pruning.DROP_SHARE * tol, delta=0.0)


@pytest.mark.parametrize("classes", [100, 1000])
def test_pruning_never_drops_a_boundary_that_can_matter_on_linear_models(classes):
    d, tol = 40, 1e-4
    budget, delta = pruning.shares(tol)
    dropped_any = kept_fewer = 0
    for trial in range(12 if classes == 100 else 4):
        model = linear_model(d, classes, seed=1000 * classes + trial)
        sigma = (0.02, 0.05, 0.1, 0.3)[trial % 4]
        x = torch.randn(32, d, generator=torch.Generator().manual_seed(trial)) * 0.05
        target, z = _exact_z(model, x, sigma)
        kept = _select(model, x, target, sigma, tol, seed=trial)
        dropped = torch.ones_like(z, dtype=torch.bool).scatter(1, kept.classes, False)
        dropped.scatter_(1, target[:, None], False)
        # Every lower bound holds, and the dropped boundaries' true tails fit the stated bound.
        finite = torch.isfinite(z)
        assert (kept.z_lower[finite] <= z[finite] * (1 + 1e-5)).all()
        true_tail = torch.where(dropped, ndtr(-z), 0.0).sum(1)
        assert (true_tail <= kept.bound - delta + 1e-15).all()
        assert (kept.bound <= budget + delta + 1e-15).all()
        # Nothing dropped has a true z anywhere near the region that matters.
        assert (z[dropped] > 5.0).all()
        assert (kept.kept == (~dropped & finite).sum(1)).all()
        dropped_any += int(dropped.sum())
        kept_fewer += int((kept.kept < classes - 1).sum())
    assert dropped_any > 0 and kept_fewer > 0, "the test should exercise pruning"


def test_the_bound_check_catches_an_underestimated_variance():
    """The failure the sketch guards against: shrink every probe derivative tenfold (a variance
    underestimated 100x) and boundaries that matter are dropped (the checks above fail)."""
    d, classes, sigma, tol = 40, 100, 0.1, 1e-4
    model = linear_model(d, classes, seed=7)
    x = torch.randn(32, d, generator=torch.Generator().manual_seed(0)) * 0.05
    target, z = _exact_z(model, x, sigma)
    keys = point_keys(0, torch.arange(len(x)), STREAM_PRUNE)
    probes = Gaussian(sigma).sample(keys, 0, pruning.PROBES, x.shape[1:])
    margin, derivatives = margin_sketch(model, x[:, None], target, probes, batch_size=len(x))
    honest = _sketch_select(margin, derivatives, target, tol=tol)
    broken = _sketch_select(margin, derivatives / 10, target, tol=tol)
    finite = torch.isfinite(z)
    assert (honest.z_lower[finite] <= z[finite] * (1 + 1e-5)).all()
    assert (broken.z_lower[finite] > z[finite]).any()
    assert (broken.kept < honest.kept).any()


@functools.cache
def _segment_on_a_linear_model() -> tuple[nn.Linear, torch.Tensor]:
    """A linear model (40 inputs, 100 classes) and 12 inputs along a segment through the origin:
    p runs from near 0 through 0.5 to near 1. Built once: no test modifies either."""
    d, classes = 40, 100
    model = linear_model(d, classes, seed=3)
    x = torch.randn(1, d, generator=torch.Generator().manual_seed(1)) * torch.linspace(0.0, 0.6, 12)[:, None]
    return model, x


@functools.cache
def _unpruned_on_the_segment(method: str, sigma: float, tol: float) -> probust.Estimate:
    """The unpruned reference of every route (computed once, not once per route: half the time)."""
    model, x = _segment_on_a_linear_model()
    make = probust.Taylor if method == "taylor" else probust.MMSE
    return make(model, sigma, tol=tol, prune="off")(x)


@pytest.mark.parametrize("route", ["auto", "direct", "head", "forward", "spectral", "sketch"])
@pytest.mark.parametrize("method", ["taylor", "mmse"])
def test_pruned_p_equals_unpruned_p_within_the_bound_on_linear_models(method, route):
    classes, tol = 100, 1e-4
    model, x = _segment_on_a_linear_model()
    make = probust.Taylor if method == "taylor" else probust.MMSE
    for sigma in (0.02, 0.05, 0.1):
        full = _unpruned_on_the_segment(method, sigma, tol)
        pruned = make(model, sigma, tol=tol, **FORCING[route])(x)
        assert torch.equal(full.target, pruned.target)
        if route not in ("auto", "spectral", "sketch"):
            assert (pruned.route == ROUTE_NAMES.index(route)).all()
        assert (pruned.boundaries_kept < classes - 1).any()
        assert (full.boundaries_kept == classes - 1).all()
        gap = (pruned.p - full.p).abs()
        # + 1e-6: the routes sum the same float32 products in another order (through the linear
        # head, 40 < 99 features, or forward mode); z moves by ~1e-7 relative.
        assert (gap <= pruned.cdf_error + full.cdf_error + 1e-6).all(), (sigma, gap, pruned.cdf_error)
        kept = torch.isfinite(pruned.grad_norm) & torch.isfinite(full.z)  # not the target
        # The kept boundaries' z are exact; the dropped ones' z lower bounds.
        torch.testing.assert_close(pruned.z[kept], full.z[kept], rtol=1e-5, atol=0)
        dropped = torch.isnan(pruned.grad_norm)
        assert (pruned.z[dropped] <= full.z[dropped] * (1 + 1e-5)).all()


@pytest.mark.parametrize("make", [probust.Taylor, probust.MMSE])
def test_prune_off_and_auto_below_the_threshold_are_bitwise_the_unpruned_path(make):
    model = linear_model(20, 10, seed=2)
    x = torch.randn(8, 20, generator=torch.Generator().manual_seed(2)) * 0.2
    default = make(model, 0.1)(x)
    off = make(model, 0.1, prune="off")(x)
    for name in ("p", "z", "margin", "grad_norm", "cdf_error", "boundaries_kept"):
        assert torch.equal(getattr(default, name), getattr(off, name)), name
    assert (off.boundaries_kept == 9).all()


def _far_classes_mlp(classes: int, near: int = 10, seed: int = 0) -> nn.Module:
    """An MLP whose logits past the first ``near`` classes sit 1,000 below: most boundaries far."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(30, 128), nn.ReLU(), nn.Linear(128, 128), nn.ReLU(), nn.Linear(128, classes))
    with torch.no_grad():
        model[-1].bias[near:] -= 1000.0
    return model.eval()


def test_routes_are_chosen_by_counted_cost():
    x = torch.randn(6, 30, generator=torch.Generator().manual_seed(0))
    # 10 classes: no route beats nine backward passes; every margin directly, bitwise as "off".
    small = _far_classes_mlp(10)
    auto, off = probust.Taylor(small, 0.3)(x), probust.Taylor(small, 0.3, prune="off")(x)
    assert (auto.route == ROUTE_NAMES.index("direct")).all() and torch.equal(auto.p, off.p)
    # 1,000 classes of which 10 can matter: 8 probes rule out the 990 far ones, which a head of
    # 128 features (129 passes) or 999 direct passes would have paid for.
    many = _far_classes_mlp(1000)
    pruned = probust.Taylor(many, 0.3)(x)
    assert (pruned.route == ROUTE_NAMES.index("candidates")).all()
    assert (pruned.boundaries_kept <= 9).all()
    # Where the boundaries may not be dropped, the cheapest route that computes them all, by
    # counts: 30 forward-mode probes at 1.5 pulls each (45) against the head's 129 passes.
    assert 30 * cost_model.jvp_in_pulls(x.device) < 129
    for options in ({"cdf": "mv-sigmoid"}, {"p_fail": True}, {"sigma": probust.Uniform(0.3)}):
        kwargs = {"sigma": 0.3, **options}
        full = probust.Taylor(many, **kwargs)(x)
        assert (full.route == ROUTE_NAMES.index("forward")).all() and (full.boundaries_kept == 999).all()
        head = probust.Taylor(many, gradients="head", **kwargs)(x)
        assert (head.route == ROUTE_NAMES.index("head")).all()
        torch.testing.assert_close(head.p, full.p, rtol=0, atol=1e-5)
    # Not pruned: every gradient directly or, by counts, by forward mode; or by the source asked for.
    off = probust.Taylor(many, 0.3, prune="off")(x)
    assert (off.route == ROUTE_NAMES.index("forward")).all() and (off.boundaries_kept == 999).all()
    assert (
        probust.Taylor(many, 0.3, prune="off", execution=Execution(jacobian="loop"))(x).route
        == ROUTE_NAMES.index("direct")
    ).all()
    for source in ("direct", "head", "forward"):
        forced = probust.Taylor(many, 0.3, prune="off", gradients=source)(x)
        assert (forced.route == ROUTE_NAMES.index(source)).all() and (forced.boundaries_kept == 999).all()
        torch.testing.assert_close(forced.p, off.p, rtol=0, atol=1e-5)


def test_a_forced_route_that_cannot_apply_is_refused():
    model = _far_classes_mlp(50)
    with pytest.raises(ValueError, match="^gradients: must be one of"):
        probust.Taylor(model, 0.1, gradients="fastest")
    with pytest.raises(ValueError, match="^gradients: 'head' does not keep the autograd graph"):
        probust.Taylor(model, 0.1, gradients="head", differentiable=True)
    with pytest.raises(ValueError, match="^gradients: 'forward' takes no backward passes"):
        probust.Taylor(model, 0.1, gradients="forward", execution=Execution(jacobian="vmap"))
    with pytest.raises(ValueError, match="^prune: 'spectral' screens the boundaries, which cannot be combined with"):
        probust.Taylor(model, 0.1, prune="spectral", cdf="mv-sigmoid")
    with pytest.raises(ValueError, match="^prune: 'sketch' screens .* gradients='head'"):
        probust.Taylor(model, 0.1, prune="sketch", gradients="head")
    with pytest.raises(ValueError, match="^jacobian: must be one of"):
        # Forward mode is a source of gradients (gradients="forward"), not a Jacobian strategy.
        probust.Taylor(model, 0.1, execution=Execution(jacobian="forward"))
    with pytest.raises(ValueError, match="needs a model whose logits come from an nn.Linear head"):
        probust.Taylor(Tempered(model), 0.1, gradients="head")(torch.randn(2, 30))


@pytest.mark.parametrize(
    "options", [{"cdf": "mv-sigmoid"}, {"p_fail": True}, {"differentiable": True}, {"sigma": probust.Uniform(0.1)}]
)
def test_a_forced_screening_refuses_what_it_cannot_bound(options):
    model = linear_model(10, 60, seed=0)
    kwargs = {"sigma": 0.1, **options}
    for screening in ("spectral", "sketch"):
        with pytest.raises(ValueError, match="^prune: "):
            probust.Taylor(model, prune=screening, **kwargs)
    for unknown in ("sometimes", "on", True, False, None):
        with pytest.raises(ValueError, match="^prune: must be"):
            probust.Taylor(model, 0.1, prune=unknown)


class _Square(torch.autograd.Function):
    """A custom autograd function with a backward but no forward-mode rule (old style: no
    setup_context, which torch.func cannot run either way)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        return x * x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        return 2 * x * grad


class _SquareThenLinear(nn.Module):
    def __init__(self, inner: nn.Linear) -> None:
        super().__init__()
        self.inner = inner

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(_Square.apply(x))


def test_a_model_forward_mode_cannot_run_is_screened_in_reverse_mode_only():
    # 80 inputs to 400 classes with no head: the sketch would be weighed, but forward mode fails.
    model = Tempered(_SquareThenLinear(linear_model(80, 400, seed=4)))
    x = torch.randn(6, 80, generator=torch.Generator().manual_seed(0)) * 0.2
    with pytest.raises(RuntimeError):  # the premise: forward mode fails on this model
        torch.func.jvp(model, (x,), (x,))
    full = probust.Taylor(model, 0.1, prune="off", execution=Execution(jacobian="loop"))(x)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no warning of a fallback either
        # The trust check may rightly flag this quadratic model's linearisation: not a fallback.
        warnings.filterwarnings("ignore", category=probust.LinearisationWarning)
        auto = probust.Taylor(model, 0.1, execution=Execution(jacobian="loop"))(x)
    assert auto.route is not None and (auto.route != ROUTE_NAMES.index("forward")).all()
    assert ((auto.p - full.p).abs() <= auto.cdf_error + full.cdf_error + 1e-6).all()
    with pytest.raises(ValueError, match="forward mode"):
        probust.Taylor(model, 0.1, prune="sketch", execution=Execution(jacobian="loop"))(x)


@functools.cache
def _trained_many_class_cnn(classes: int = 120) -> tuple[nn.Module, torch.Tensor]:
    """A tiny CNN trained briefly on noisy copies of random class prototypes ([1, 8, 8]), and
    test inputs: prototypes and midpoints between two of them (p spread over (0, 1)). Trained
    once per session (the same model every time: seeded, one thread); no test modifies it."""
    gen = torch.Generator().manual_seed(0)
    prototypes = torch.rand(classes, 1, 8, 8, generator=gen)
    model = nn.Sequential(
        nn.Conv2d(1, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 64), nn.ReLU(), nn.Linear(64, classes)
    )
    torch.manual_seed(0)
    opt = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(150):
        y = torch.randint(classes, (256,), generator=gen)
        x = prototypes[y] + 0.15 * torch.randn(256, 1, 8, 8, generator=gen)
        loss = nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()
    mids = 0.5 * (prototypes[:8] + prototypes[8:16])
    return model, torch.cat([prototypes[:8], mids])


@functools.cache
def _unpruned_on_the_cnn(make: type, sigma: float, tempered: bool) -> probust.Estimate:
    """The unpruned reference of every route on the CNN (or on it Tempered), computed once.

    In the standard memory format, as the pruned runs it is compared with: a plan measured for each
    could put one in channels_last, whose float32 rounding moves p by up to 2.7e-6 at sigma 0.02,
    which neither run's cdf_error covers."""
    model, x = _trained_many_class_cnn()
    return make(
        Tempered(model) if tempered else model,
        sigma,
        prune="off",
        tol=1e-3,
        execution=Execution(jacobian="vmap", channels_last=False),
    )(x)


@pytest.mark.parametrize("route", ["auto", "head", "spectral", "sketch", "sketch-no-head"])
@pytest.mark.parametrize("make", [probust.Taylor, probust.MMSE])
def test_pruned_and_full_agree_within_the_bound_on_a_trained_many_class_cnn(make, route):
    model, x = _trained_many_class_cnn()
    tempered = route == "sketch-no-head"
    if tempered:
        model, route = Tempered(model), "sketch"
    middling = dropped = 0
    for sigma in (0.02, 0.05, 0.1):
        full = _unpruned_on_the_cnn(make, sigma, tempered)
        pruned = make(
            model, sigma, tol=1e-3, execution=Execution(jacobian="vmap", channels_last=False), **FORCING[route]
        )(x)
        assert torch.equal(full.target, pruned.target)
        gap = (pruned.p - full.p).abs()
        # + 1e-6: the head route sums the same float32 products in another order (z moves by
        # ~1e-7 relative), which neither error estimate covers.
        assert (gap <= pruned.cdf_error + full.cdf_error + 1e-6).all(), (sigma, gap, pruned.cdf_error)
        dropped += int((pruned.boundaries_kept < 119).sum())
        middling += int(((full.p > 0.2) & (full.p < 0.8)).sum())
    assert middling >= 2, "some points should have p near 0.5"
    assert dropped > 0, "the test should exercise pruning"


def test_exact_selection_drops_only_within_its_share_and_reserves_no_failure():
    gen = torch.Generator().manual_seed(3)
    margin = torch.rand(50, 30, generator=gen) * 4
    variance = torch.rand(50, 30, generator=gen) + 0.05
    variance[:, 5] = 0.0  # a boundary the noise cannot move: never crossed (c > 0)
    target = torch.randint(30, (50,), generator=gen)
    tol = 1e-3
    kept = _exact_select(margin, variance, target, tol=tol)
    z = margin.double() / variance.double().sqrt()
    z[:, 5] = torch.inf
    z = z.scatter(1, target[:, None], torch.inf)
    torch.testing.assert_close(kept.z_lower, z)
    assert kept.reserved == pruning.DROP_SHARE * tol
    chosen = torch.zeros_like(z, dtype=torch.bool).scatter(1, kept.classes, True)
    chosen = chosen.scatter(1, target[:, None], False)
    tails = ndtr(-z)
    assert torch.equal(chosen.sum(1), kept.kept)
    torch.testing.assert_close(kept.bound, torch.where(chosen, 0.0, tails).sum(1))  # no failure term
    assert (kept.bound <= kept.reserved).all()
    # Everything dropped has a smaller tail than everything kept.
    dropped_max = torch.where(chosen, 0.0, tails).max(1).values
    kept_min = torch.where(chosen, tails, torch.inf).min(1).values
    assert (dropped_max <= kept_min).all()


def test_points_are_grouped_by_their_own_kept_count_rounded_up_to_a_power_of_two():
    gen = torch.Generator().manual_seed(4)
    margin = torch.rand(40, 30, generator=gen) * torch.linspace(0.01, 4, 40).view(-1, 1)
    variance = torch.rand(40, 30, generator=gen) + 0.05
    target = torch.randint(30, (40,), generator=gen)
    kept = _exact_select(margin, variance, target, tol=1e-4)
    seen = torch.zeros(40, dtype=torch.bool)
    for index, group in pruning.by_width(kept, target):
        width = group.classes.shape[1]
        assert (
            width & (width - 1) == 0 and (group.kept <= width).all() and (2 * group.kept > width).all() | (width == 1)
        )
        for row, point in enumerate(index.tolist()):
            k = int(kept.kept[point])
            assert torch.equal(group.classes[row, :k], kept.classes[point, :k])  # every kept boundary
            assert (group.classes[row, k:] == target[point]).all()  # then padding
        seen[index] = True
    assert seen.all()


@pytest.mark.parametrize("route", ["sketch", "spectral", "direct"])
@pytest.mark.parametrize("make", [probust.Taylor, probust.MMSE])
def test_screened_estimates_do_not_depend_on_the_batch_split(make, route):
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Flatten(), nn.Linear(36, 80), nn.Tanh(), nn.Linear(80, 60)).eval()
    model = Tempered(inner)  # no linear head: screening or every boundary directly
    x = torch.rand(12, 1, 6, 6, generator=torch.Generator().manual_seed(5)) * torch.linspace(0.2, 3, 12).view(
        -1, 1, 1, 1
    )
    estimator = make(model, 0.3, execution=Execution(batch_size=4, jacobian="vmap"), **FORCING[route])
    whole = estimator(x)
    assert len(set(whole.boundaries_kept.tolist())) > 2  # points of different widths
    for k in (4, 8):
        first, rest = estimator(x[:k]), estimator(x[k:], index_offset=k)
        assert torch.equal(torch.cat([first.p, rest.p]), whole.p)
        assert torch.equal(torch.cat([first.z, rest.z]), whole.z)
