"""Margin gradients through the model's last linear layer (probust.linearisation.head)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
from probust.execution import Execution
from probust.linearisation import head as linear_head
from probust.linearisation.exact import boundary_variances, boundary_weights, margin_normals
from probust.linearisation.margins import margin_jacobian
from probust.linearisation.pullback import Pullback
from probust.linearisation.routes import ROUTE_NAMES
from probust.noise import Gaussian, Uniform
from tests._helpers import Tempered


def _deep(classes: int = 40, width: int = 12, seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.Tanh(),
        nn.Flatten(),
        nn.Linear(4 * 36, width),
        nn.Tanh(),
        nn.Linear(width, classes),
    ).eval()


def _inputs(n: int = 5, seed: int = 1) -> torch.Tensor:
    return torch.rand(n, 1, 6, 6, generator=torch.Generator().manual_seed(seed))


class _EditedInPlace(Tempered):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.inner(x).mul_(2.0)  # the head's output object, changed after it ran


class _SharedHead(nn.Module):
    """One Linear used twice: the one whose output is returned ran two times."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.tanh(self.fc(x)))


def test_finds_the_last_linear_layer_of_a_sequential_model():
    model = _deep()
    assert linear_head.find_linear_head(model, _inputs(1)) is model[-1]


@pytest.mark.parametrize(
    "model",
    [Tempered(_deep()), _EditedInPlace(_deep()), _SharedHead(), nn.Sequential(nn.Linear(8, 8), nn.Tanh())],
    ids=["temperature", "edited-in-place", "called-twice", "ends-in-tanh"],
)
def test_refuses_anything_that_is_not_a_plain_linear_head(model):
    x = _inputs(1) if not isinstance(model, (_SharedHead, nn.Sequential)) else torch.randn(1, 8)
    assert linear_head.find_linear_head(model, x) is None


def test_refuses_plain_callables_and_torchscript():
    model = _deep()
    x = _inputs(1)
    assert linear_head.find_linear_head(lambda t: model(t), x) is None  # type: ignore[arg-type]
    assert linear_head.find_linear_head(torch.jit.trace(model, x), x) is None


@pytest.mark.parametrize("strategy", ["vmap", "loop"])
def test_margin_gradients_through_the_head_equal_the_direct_ones(strategy):
    model, x = _deep(), _inputs()
    head = linear_head.find_linear_head(model, x[:1])
    assert head is not None
    pulled = Pullback(model, x, head, strategy=strategy)
    basis = torch.eye(12)[:, None].expand(-1, len(x), -1)
    jacobian = pulled.pull(basis)  # row k: features' gradient e_k^T J
    direct_logits, target, direct = margin_jacobian(model, x)
    assert torch.equal(pulled.logits, direct_logits)
    u = margin_normals(boundary_weights(head, target), jacobian)
    torch.testing.assert_close(u, direct, rtol=1e-5, atol=1e-6)
    assert (u[torch.arange(len(x)), target] == 0).all()  # W_t - W_t: exactly zero at the target
    classes = torch.tensor([[3, 7], [0, 1], [5, 5], [2, 9], [8, 4]])
    some = margin_normals(boundary_weights(head, target, classes), jacobian)
    torch.testing.assert_close(some, direct.gather(1, classes.view(5, 2, 1, 1, 1).expand(-1, -1, 1, 6, 6)))


def _relu_net(classes: int = 40, width: int = 24, seed: int = 0) -> nn.Module:
    """A ReLU before the head, with biases pushed negative: many features exactly 0."""
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, width), nn.ReLU(), nn.Linear(width, classes)).eval()
    with torch.no_grad():
        model[1].bias.sub_(0.5)
    return model


class _ZeroValuedFeatures(nn.Module):
    """Features whose values are exactly 0 but whose gradients are not: no row may be skipped."""

    def __init__(self) -> None:
        super().__init__()
        self.inner = nn.Linear(36, 12)
        self.head = nn.Linear(12, 40)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.inner(x.flatten(1))
        return self.head(a - a.detach())


@pytest.mark.parametrize("make", [probust.Taylor, lambda *a, **k: probust.MMSE(*a, n_samples=3, **k)])
@pytest.mark.parametrize("jacobian", ["vmap", "loop"])
def test_rows_of_features_held_at_zero_are_skipped_and_still_exact(make, jacobian):
    model, x = _relu_net(), _inputs(6)
    with torch.no_grad():
        features = model[:3](x)
    assert (features == 0).float().mean() > 0.3  # the premise: many dead features
    # mv-sigmoid: nothing pruned, so every boundary's gradient comes out and can be compared.
    on_head = make(model, 0.2, cdf="mv-sigmoid", gradients="head", execution=Execution(jacobian=jacobian))(x)
    direct = make(model, 0.2, cdf="mv-sigmoid", prune="off", execution=Execution(jacobian=jacobian))(x)
    assert (on_head.route == ROUTE_NAMES.index("head")).all()
    torch.testing.assert_close(on_head.grad_norm, direct.grad_norm, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(on_head.z, direct.z, rtol=1e-5, atol=1e-6)


def test_a_feature_at_zero_with_a_gradient_is_not_skipped():
    model, x = _ZeroValuedFeatures().eval(), _inputs(3)
    assert linear_head.find_linear_head(model, x[:1]) is model.head
    on_head = probust.Taylor(model, 0.2, cdf="mv-sigmoid", gradients="head")(x)
    direct = probust.Taylor(model, 0.2, cdf="mv-sigmoid", prune="off")(x)
    torch.testing.assert_close(on_head.grad_norm, direct.grad_norm, rtol=1e-5, atol=1e-6)
    assert (direct.grad_norm.sum(1) > 0).all()  # the premise: the features at 0 carry gradients


def test_boundary_variances_are_the_diagonal_of_the_quadratic_form():
    model, x = _deep(), _inputs()
    head = linear_head.find_linear_head(model, x[:1])
    assert head is not None
    pulled = Pullback(model, x, head)
    jacobian = pulled.pull(torch.eye(12)[:, None].expand(-1, len(x), -1))
    target = pulled.logits.argmax(1)
    weights = boundary_weights(head, target)
    for noise in (Gaussian(0.3), Gaussian(torch.rand(1, 6, 6) + 0.1)):
        direct = noise.quadratic_form(margin_normals(weights, jacobian)).diagonal(dim1=1, dim2=2)
        variance = boundary_variances(weights, noise.quadratic_form(jacobian))
        torch.testing.assert_close(variance, direct, rtol=1e-5, atol=1e-9)  # direct: u in float32


def test_boundary_norms_bound_the_exact_ones_tightly_and_per_point():
    torch.manual_seed(3)
    head = nn.Linear(300, 50)
    with torch.no_grad():
        head.weight[7] = head.weight[2] + 1e-6  # a nearly equal pair: the Gram form cancels
        head.weight[9] *= 1e3  # rows of very different norms
    target = torch.tensor([2, 7, 9, 2, 0])
    weight = head.weight.detach().double()
    exact = (weight[target][:, None] - weight[None]).square().sum(2)  # float32 differences are exact in float64
    got = linear_head.boundary_norms_squared(head, target)
    assert got.dtype == torch.float64 and got.shape == (5, 50)
    assert bool((got >= exact).all())
    assert bool((got[torch.arange(5), target] == 0).all())
    scale = weight.square().sum(1)
    assert bool(((got - exact) <= 1e-11 * (scale[target][:, None] + scale[None])).all())
    # A point's row depends only on its target and the head, not on the batch.
    for i in range(5):
        assert torch.equal(linear_head.boundary_norms_squared(head, target[i : i + 1])[0], got[i])
    assert torch.equal(linear_head.boundary_norms_squared(head, target[:0]), got[:0])


@pytest.mark.parametrize("make", [probust.Taylor, probust.MMSE])
def test_estimators_take_the_head_path_and_agree_with_every_direct_gradient(make):
    model, x = _deep(classes=40, width=12), _inputs(8)
    for sigma in (0.1, 0.5):
        pruned, full = make(model, sigma, tol=1e-5)(x), make(model, sigma, tol=1e-5, prune="off")(x)
        assert (pruned.route == ROUTE_NAMES.index("head")).all()  # 12 features against 39 margins
        assert torch.equal(pruned.target, full.target)
        # The float32 products summed in another order: ~1e-7 relative on z.
        assert ((pruned.p - full.p).abs() <= pruned.cdf_error + full.cdf_error + 1e-6).all()
        kept = pruned.boundaries_kept
        assert kept is not None and (kept <= 39).all()
        finite = torch.isfinite(pruned.grad_norm)
        torch.testing.assert_close(pruned.grad_norm[finite], full.grad_norm[finite], rtol=1e-5, atol=1e-6)
        torch.testing.assert_close(pruned.z, full.z, rtol=1e-5, atol=1e-6)  # exact z for every boundary
        assert not pruned.p.requires_grad and not pruned.z.requires_grad


def test_the_head_path_without_pruning_serves_non_gaussian_noise():
    model, x = _deep(classes=40, width=12), _inputs(4)
    noise = Uniform(0.2)
    on_head, direct = probust.Taylor(model, noise)(x), probust.Taylor(model, noise, prune="off")(x)
    assert (on_head.route == ROUTE_NAMES.index("head")).all()
    assert (on_head.boundaries_kept == 39).all()  # nothing pruned: the bounds need Gaussian noise
    torch.testing.assert_close(on_head.p, direct.p, rtol=0, atol=1e-5)


def test_no_head_path_where_it_would_not_pay_or_is_off():
    x = _inputs(4)
    wide = _deep(classes=10, width=12)  # 12 features >= 9 margins: every margin directly
    default, off = probust.Taylor(wide, 0.1)(x), probust.Taylor(wide, 0.1, prune="off")(x)
    direct = ROUTE_NAMES.index("direct")
    assert (default.route == direct).all() and torch.equal(default.p, off.p)
    narrow = _deep(classes=40, width=12)
    assert (probust.Taylor(narrow, 0.1, prune="off")(x).route == direct).all()
    assert (probust.Taylor(narrow, 0.1, differentiable=True)(x).route == direct).all()
    assert (probust.Taylor(Tempered(narrow), 0.1)(x).route == ROUTE_NAMES.index("direct")).all()


@pytest.mark.parametrize("make", [probust.Taylor, probust.MMSE])
def test_a_points_estimate_does_not_depend_on_what_its_block_keeps_alive(make):
    # Blocks of 4 rows whose points keep different numbers of features alive: the vmapped
    # passes must have the same shapes whatever the block, so splits give the same bits.
    model = _relu_net(classes=60, width=40)
    x = torch.rand(12, 1, 6, 6, generator=torch.Generator().manual_seed(5)) * torch.linspace(0.2, 3, 12).view(
        -1, 1, 1, 1
    )
    estimator = make(model, 0.2, execution=Execution(batch_size=4, jacobian="vmap"))
    whole = estimator(x)
    assert (whole.route == ROUTE_NAMES.index("head")).all()
    for k in (4, 8):
        first, rest = estimator(x[:k]), estimator(x[k:], index_offset=k)
        assert torch.equal(torch.cat([first.p, rest.p]), whole.p)
        assert torch.equal(torch.cat([first.z, rest.z]), whole.z)
