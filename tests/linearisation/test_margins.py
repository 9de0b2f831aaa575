"""Margins and their input gradients (probust.linearisation.pullback) against torch.autograd.functional.jacobian.

The oracle differentiates one point at a time with ``torch.autograd.functional.jacobian`` on a small
non-linear float64 model; every batched strategy must agree with it to float64 rounding.
"""

from __future__ import annotations

import pytest
import torch
from torch import nn

from probust.linearisation.margins import logit_jacobian, margin_gradients, margin_jacobian, margin_sketch
from probust.linearisation.pullback import margins, other_classes

F64 = torch.float64
STRATEGIES = ("loop", "vmap", "forward")
CLASSES = 5
TOL = dict(rtol=1e-10, atol=1e-12)


def _model(seed: int = 0) -> nn.Module:
    """A non-linear classifier on inputs [B, 2, 3] with CLASSES logits, in float64."""
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, CLASSES)).to(F64).eval()


def _inputs(points: int = 4, seed: int = 1) -> torch.Tensor:
    return torch.randn(points, 2, 3, generator=torch.Generator().manual_seed(seed), dtype=F64)


def _oracle_jacobian(model: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """[B, C, *S]: each point's logit Jacobian on its own."""
    return torch.stack([torch.autograd.functional.jacobian(lambda v: model(v[None])[0], row) for row in x])


def _oracle_margin_gradients(jacobian: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """u[b, i] = J[b, t_b] - J[b, i], by a loop."""
    u = torch.empty_like(jacobian)
    for b in range(len(target)):
        for i in range(jacobian.shape[1]):
            u[b, i] = jacobian[b, target[b]] - jacobian[b, i]
    return u


# ---------------------------------------------------------------- margins and classes


def test_margins_are_the_target_logit_minus_each_logit():
    logits = torch.randn(4, CLASSES, generator=torch.Generator().manual_seed(0))
    target = torch.tensor([0, 3, 4, 3])
    g = margins(logits, target)
    for b in range(4):
        for i in range(CLASSES):
            assert g[b, i] == logits[b, target[b]] - logits[b, i]
    assert (g.gather(1, target[:, None]) == 0).all()


def test_other_classes_lists_every_class_but_the_target_in_order():
    target = torch.tensor([0, 2, 4, 2])
    others = other_classes(target, CLASSES)
    assert others.dtype == torch.int64
    assert others.tolist() == [[c for c in range(CLASSES) if c != t] for t in target.tolist()]


# ---------------------------------------------------------------- Jacobians


@pytest.mark.parametrize("chunk", [None, 2])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_logit_jacobian_equals_autograd_for_every_strategy(strategy, chunk):
    model, x = _model(), _inputs()
    logits, jacobian = logit_jacobian(model, x, strategy=strategy, class_chunk_size=chunk)
    torch.testing.assert_close(logits, model(x).detach(), **TOL)
    assert jacobian.shape == (4, CLASSES, 2, 3) and not jacobian.requires_grad
    torch.testing.assert_close(jacobian, _oracle_jacobian(model, x), **TOL)
    # only some classes' rows
    classes = torch.tensor([3, 1])
    _, some = logit_jacobian(model, x, strategy=strategy, class_chunk_size=chunk, classes=classes)
    torch.testing.assert_close(some, _oracle_jacobian(model, x)[:, classes], **TOL)


@pytest.mark.parametrize("given_target", [False, True], ids=["prediction", "given"])
@pytest.mark.parametrize("strategy", STRATEGIES)
def test_margin_jacobian_equals_autograd_for_every_strategy(strategy, given_target):
    model, x = _model(), _inputs()
    prediction = model(x).argmax(1)
    target = torch.tensor([1, 0, 4, 2]) if given_target else None
    logits, t, u = margin_jacobian(model, x, target, strategy=strategy)
    expected_target = target if given_target else prediction
    assert torch.equal(t, expected_target)
    torch.testing.assert_close(logits, model(x).detach(), **TOL)
    expected = _oracle_margin_gradients(_oracle_jacobian(model, x), expected_target)
    torch.testing.assert_close(u, expected, **TOL)
    assert (u.gather(1, t.view(-1, 1, 1, 1).expand(-1, 1, 2, 3)) == 0).all()
    # the same from the full logit Jacobian by subtraction
    torch.testing.assert_close(margin_gradients(_oracle_jacobian(model, x), expected_target), expected, **TOL)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_margin_jacobian_limit_gives_the_first_margins_in_the_order_of_the_other_classes(strategy):
    model, x = _model(), _inputs()
    target = torch.tensor([1, 0, 4, 2])
    _, _, full = margin_jacobian(model, x, target, strategy=strategy)
    _, _, some = margin_jacobian(model, x, target, strategy=strategy, limit=2)
    first_two = other_classes(target, CLASSES)[:, :2]
    assert some.shape == (4, 2, 2, 3)
    torch.testing.assert_close(some, full.gather(1, first_two.view(4, 2, 1, 1).expand(-1, -1, 2, 3)), **TOL)


def test_margin_jacobian_refuses_a_target_out_of_range():
    with pytest.raises(ValueError, match=r"^target: label 5 of point 3 is not a class of the model's 5 outputs"):
        margin_jacobian(_model(), _inputs(), torch.tensor([0, 1, 2, CLASSES]))


@pytest.mark.parametrize("strategy", ["loop", "vmap", "forward"])
def test_differentiable_margin_jacobian_keeps_the_graph_to_the_parameters(strategy):
    model, x = _model(), _inputs()
    _, t, u = margin_jacobian(model, x, strategy=strategy, differentiable=True)
    assert u.requires_grad
    # d/dW of sum(u) against the oracle's own double backward
    params = list(model.parameters())
    grads = torch.autograd.grad(u.sum(), params, allow_unused=True)

    def total(*weights: torch.Tensor) -> torch.Tensor:
        functional = dict(zip([n for n, _ in model.named_parameters()], weights))

        def logits_of(v: torch.Tensor) -> torch.Tensor:
            return torch.func.functional_call(model, functional, (v[None],))[0]

        jac = torch.stack([torch.autograd.functional.jacobian(logits_of, row, create_graph=True) for row in x])
        return _oracle_margin_gradients(jac, t).sum()

    expected = torch.autograd.grad(total(*params), params, allow_unused=True)
    for got, want in zip(grads, expected):
        if want is None:
            assert got is None or (got == 0).all()
        else:
            torch.testing.assert_close(got, want, **TOL)


def test_margin_sketch_gives_each_margins_derivative_along_each_probe():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 16), nn.Tanh(), nn.Linear(16, 7))
    x = torch.randn(4, 3, 6)  # 4 points, 3 copies each
    target = torch.tensor([0, 3, 6, 2])
    probes = torch.randn(4, 5, 6)
    g, d = margin_sketch(model, x, target, probes, batch_size=5, probe_chunk_size=2)
    rows = x.reshape(12, 6)
    logits, _, u = margin_jacobian(model, rows, target.repeat_interleave(3))
    expected_g = margins(logits, target.repeat_interleave(3)).view(4, 3, 7).mean(1)
    expected_d = torch.einsum("bnci,bki->bkc", u.view(4, 3, 7, 6).double(), probes.double()) / 3
    torch.testing.assert_close(g, expected_g, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(d.double(), expected_d, rtol=1e-4, atol=1e-5)
