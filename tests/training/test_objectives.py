"""probust.training.objectives: the gradient-norm penalty against closed forms and per-example autograd."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

import probust.models as pm
from probust.training import evaluate, input_gradient_penalty, objective, train

QUICK = {"epochs": 1, "lr": 0.05, "batch_size": 64, "show_progress": False}


def test_penalty_is_the_mean_squared_norm_of_each_examples_loss_gradient():
    torch.manual_seed(0)
    model = pm.build("cnn", 10, (1, 8, 8))
    x, y = torch.rand(5, 1, 8, 8), torch.tensor([0, 3, 3, 9, 1])

    ce, penalty, logits = input_gradient_penalty(model, x, y)

    norms = []
    for i in range(5):  # one example at a time: no batch effects possible
        xi = x[i : i + 1].clone().requires_grad_(True)
        (g,) = torch.autograd.grad(F.cross_entropy(model(xi), y[i : i + 1]), xi)
        norms.append(g.pow(2).sum())
    assert torch.allclose(penalty, torch.stack(norms).mean(), rtol=1e-5)
    assert torch.allclose(ce, F.cross_entropy(model(x), y)) and torch.allclose(logits, model(x))


def test_penalty_matches_the_closed_form_for_a_linear_model():
    torch.manual_seed(1)
    model = pm.build("linear", 4, (1, 2, 3)).double()
    x, y = torch.rand(6, 1, 2, 3, dtype=torch.float64), torch.tensor([0, 1, 2, 3, 0, 1])

    _, penalty, _ = input_gradient_penalty(model, x, y)

    # d CE / dx = W^T (softmax(Wx + b) - onehot(y)) for logits Wx + b.
    W, b = model.fc.weight, model.fc.bias
    p = torch.softmax(x.flatten(1) @ W.T + b, dim=1)
    grad = (p - F.one_hot(y, 4).double()) @ W
    assert torch.allclose(penalty, grad.pow(2).sum(1).mean(), rtol=1e-10)


def test_penalty_is_differentiable_in_the_weights():
    torch.manual_seed(2)
    layer = nn.Linear(5, 3).double()
    x, y = torch.rand(4, 5, dtype=torch.float64), torch.tensor([0, 2, 1, 2])

    def penalty_of(weight, bias):
        return input_gradient_penalty(lambda z: F.linear(z, weight, bias), x, y)[1]

    weight = layer.weight.detach().requires_grad_(True)
    bias = layer.bias.detach().requires_grad_(True)
    assert torch.autograd.gradcheck(penalty_of, (weight, bias))  # double backprop is exact


def test_objective_adds_lambda_times_penalty_and_the_extra_loss():
    torch.manual_seed(3)
    model = pm.build("cnn", 10, (1, 8, 8))
    x, y = torch.rand(4, 1, 8, 8), torch.tensor([1, 2, 3, 4])
    seen = {}

    def extra(m, xb, yb, logits):
        seen.update(model=m, x=xb, y=yb, logits=logits)
        return torch.tensor(0.75)

    ce, penalty, _ = input_gradient_penalty(model, x, y)
    loss, logits = objective(model, x, y, grad_reg=1e-2, extra_loss=extra)

    assert torch.allclose(loss, ce + 1e-2 * penalty + 0.75)
    assert seen["model"] is model and torch.equal(seen["x"], x) and seen["logits"] is logits
    assert torch.allclose(objective(model, x, y)[0], F.cross_entropy(model(x), y))


def test_gradient_regularisation_makes_the_model_flatter(digits):
    train_ds, test_ds = digits
    penalties = []
    X, Y = test_ds.tensors()
    for lam in (0.0, 1e-1, 1.0):
        result = train(train_ds, "linear", **{**QUICK, "epochs": 3}, grad_reg=lam, test_dataset=test_ds)
        penalties.append(float(input_gradient_penalty(result.model, X, Y)[1].detach()))
        assert result.meta["grad_reg"] == lam
    assert penalties[0] > penalties[1] > penalties[2] and penalties[2] < 0.5 * penalties[0]


def test_evaluate_is_the_fraction_of_correct_argmax_predictions_and_keeps_the_mode(digits):
    torch.manual_seed(0)
    model = pm.build("linear", 10, (1, 8, 8)).train()
    X, Y = digits[1].tensors()

    accuracy = evaluate(model, digits[1], batch_size=100)  # several batches, a short last one

    with torch.no_grad():
        expected = (model(X).argmax(1) == Y).double().mean().item()
    assert accuracy == expected and model.training
