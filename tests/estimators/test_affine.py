"""Noisy logits of affine models drawn in the logits' space (probust.estimators.affine): Monte
Carlo, CERTIFY and PREDICT on a linear model without a forward pass per copy."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust
from probust.estimators import affine
from probust.models import build
from tests._helpers import inside


def _linear(classes: int = 10, shape=(1, 28, 28)) -> nn.Module:
    torch.manual_seed(0)
    return build("linear", classes, shape).eval()


class CountingForward(nn.Module):
    """A model that counts the rows it is run on."""

    def __init__(self, inner: nn.Module) -> None:
        super().__init__()
        self.inner, self.rows = inner, 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.rows += x.shape[0]
        return self.inner(x)


class ReluInForward(nn.Module):
    """Only affine layers, but a ReLU written in the forward: not affine."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = nn.Linear(64, 32), nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.b(torch.relu(self.a(x)))


def test_monte_carlo_on_a_linear_model_matches_the_exact_probability():
    # For a linear model Taylor is exact (the mvn-cdf of its boundaries): each Monte Carlo
    # interval at 99.9% holds it, but for about 0.1% of the 300 points (at most 3 allowed).
    model = _linear()
    x = torch.rand(300, 1, 28, 28, generator=torch.Generator().manual_seed(1)) * 0.2 + 0.4
    exact = probust.Taylor(model, 0.5, check_draws=0, tol=1e-6)(x).p
    mc = probust.MonteCarlo(model, 0.5, n_samples=3000, confidence=0.999, interval="clopper-pearson")(x)
    assert 0.2 < float(exact.mean()) < 0.8  # points spread around the boundaries
    assert int((~inside(exact, mc, slack=1e-6)).sum()) <= 3


def test_a_linear_models_copies_do_not_run_the_model():
    counted = CountingForward(_linear())
    x = torch.rand(5, 1, 28, 28, generator=torch.Generator().manual_seed(2))
    probust.MonteCarlo(counted, 0.3, n_samples=5000)(x)
    # the clean pass, the contract's probe, and the checks' few rows: far below 5 x 5,000
    assert counted.rows < 100


def test_the_draws_do_not_depend_on_the_batch_split_nor_the_rows_per_pass():
    model = _linear()
    x = torch.rand(23, 1, 28, 28, generator=torch.Generator().manual_seed(3)) * 0.2 + 0.4
    whole = probust.MonteCarlo(model, 0.4, n_samples=1500)(x).p
    parts = torch.cat(
        [probust.MonteCarlo(model, 0.4, n_samples=1500)(x[i : i + 5], index_offset=i).p for i in range(0, 23, 5)]
    )
    assert torch.equal(whole, parts)
    assert 0 < int(((whole > 0) & (whole < 1)).sum())


@pytest.mark.parametrize(
    "model",
    [
        nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.ReLU(), nn.Linear(32, 4)),
        nn.Sequential(nn.Flatten(), nn.Linear(64, 32), nn.Tanh(), nn.Linear(32, 4)),
        ReluInForward(),
    ],
    ids=["relu-layer", "tanh-layer", "relu-in-forward"],
)
def test_a_nonlinear_model_is_not_taken_for_an_affine_one(model):
    torch.manual_seed(0)
    x = torch.randn(4, 64)
    if isinstance(model, nn.Sequential):
        x = x.view(4, 1, 8, 8)
    clean = lambda: model(x)  # noqa: E731
    assert affine.affine_logits(model.eval(), probust.Gaussian(0.5), x, clean) is None


def test_only_gaussian_noise_and_few_classes_take_the_affine_path():
    model = _linear()
    x = torch.rand(2, 1, 28, 28)
    clean = lambda: model(x)  # noqa: E731
    assert affine.affine_logits(model, probust.Gaussian(0.5), x, clean) is not None
    assert affine.affine_logits(model, probust.Laplace(0.5), x, clean) is None
    wide = _linear(classes=300)  # C > D / 4: the copies go through the model
    assert affine.affine_logits(wide, probust.Gaussian(0.5), x, lambda: wide(x)) is None


def test_the_logits_noise_has_the_covariance_of_j_s_j():
    # L L^T = J S J^T for a diagonal S: the factor's covariance against the closed form.
    model = _linear(classes=5, shape=(1, 6, 6))
    std = torch.linspace(0.1, 0.9, 36).view(1, 6, 6)
    noise = probust.Gaussian(std)
    x = torch.rand(3, 1, 6, 6)
    found = affine.affine_logits(model, noise, x, lambda: model(x))
    assert found is not None
    weight = model.fc.weight.detach().double() / model.normalize.std.double().flatten()[0]
    expected = weight @ torch.diag(std.double().flatten() ** 2) @ weight.T
    assert torch.allclose(found.factor.double() @ found.factor.double().T, expected, rtol=1e-5, atol=1e-7)


def test_certify_on_a_linear_model_certifies_the_distance_to_its_boundary():
    # Two classes: the smoothed classifier of a linear model predicts its own class with
    # p_A = Phi(d / sigma), d the distance to the boundary, so CERTIFY's radius
    # sigma * Phi^-1(p_lower) is at most d (p_lower <= p_A with probability 1 - alpha per point)
    # and, with n = 20,000 draws, close below it where p_A is not near 1 (p_lower is then near p_A).
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 2)).eval()
    x = torch.randn(12, 1, 8, 8, generator=torch.Generator().manual_seed(4)) * 0.05
    w = model[1].weight.detach()
    logits = model(x).detach()
    t = logits.argmax(1)
    rows = torch.arange(len(x))
    distance = ((logits[rows, t] - logits[rows, 1 - t]) / (w[0] - w[1]).norm()).double()
    c = probust.certify(model, x, sigma=0.5, n=20_000)
    assert torch.equal(c.prediction[c.prediction >= 0], t[c.prediction >= 0])
    assert (c.radius <= distance + 1e-9).all()
    moderate = (distance > 0.1) & (distance < 1.0)
    assert int(moderate.sum()) >= 3, distance
    assert (c.radius[moderate] >= distance[moderate] - 0.05).all(), (c.radius, distance)


def test_the_drawn_logits_have_the_covariance_of_j_s_j():
    # Logits whose noise is strongly correlated (rows of W near one another, of unequal sizes):
    # the covariance of 400,000 drawn copies' logits against W S W^T, computed apart.
    torch.manual_seed(0)
    base = torch.randn(1, 36)
    model = nn.Sequential(nn.Flatten(), nn.Linear(36, 4)).eval()
    with torch.no_grad():
        model[1].weight.copy_(base * torch.tensor([[1.0], [2.0], [0.5], [-1.5]]) + 0.3 * torch.randn(4, 36))
    x = torch.rand(1, 1, 6, 6)
    found = affine.affine_logits(model, probust.Gaussian(0.7), x, lambda: model(x))
    assert found is not None
    keys = torch.tensor([12345])
    drawn = found.logits(slice(0, 1), keys, 0, 400_000).double()
    w = model[1].weight.detach().double()
    expected = 0.49 * w @ w.T
    scale = expected.diagonal().sqrt()
    assert ((expected / scale[:, None] / scale[None, :]).abs() > 0.8).all()  # correlations far from 0
    assert torch.allclose(drawn.mean(0), model(x).detach().double()[0], atol=0.05)
    assert torch.allclose(drawn.T.cov(), expected, rtol=0.02, atol=0.02 * float(expected.abs().max()))
