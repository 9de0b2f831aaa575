"""The call convention every estimator shares: eval mode, bad inputs and arguments refused by name.

(:mod:`tests.estimators.test_contract` proves the same for every registered method.)"""

from __future__ import annotations

import pytest
import torch
from torch import nn

import probust


def test_model_mode_is_restored_and_computation_is_in_eval_mode():
    model = nn.Sequential(nn.Linear(6, 10), nn.Dropout(0.5), nn.Linear(10, 3))
    model.train()
    model[2].eval()
    x = torch.randn(4, 6)
    a = probust.Taylor(model, 0.1)(x).p
    b = probust.Taylor(model, 0.1)(x).p
    assert torch.equal(a, b), "dropout must be off during estimation"
    assert model.training and model[1].training and not model[2].training


@pytest.mark.parametrize(
    "build, x_fn, match",
    [
        (lambda m: probust.Taylor(m, 0.1), lambda x: x.clone().index_fill_(1, torch.tensor([0]), float("nan")), "NaN"),
        (lambda m: probust.Taylor(m, 0.1), lambda x: x[:0], "empty"),
        (lambda m: probust.Taylor(m, 0.1), lambda x: (x * 255).to(torch.uint8), "floating point"),
        (lambda m: probust.Taylor(m, 0.1), lambda x: x[0], "batch dimension"),
    ],
)
def test_bad_inputs_are_refused_with_a_message(small, build, x_fn, match):
    model, x = small
    with pytest.raises(ValueError, match=match):
        build(model)(x_fn(x))


@pytest.mark.parametrize("sigma", [0, -0.1, float("nan"), float("inf"), "a"])
def test_bad_sigma_is_refused(small, sigma):
    model, _ = small
    with pytest.raises(ValueError, match="sigma"):
        probust.Taylor(model, sigma)


NOISE_ESTIMATORS = [probust.MonteCarlo, probust.Taylor, probust.MMSE, probust.MonteCarloCV, probust.MonteCarloIS]


@pytest.mark.parametrize("cls", NOISE_ESTIMATORS)
def test_sigma_is_a_required_argument_of_every_noise_estimator(small, cls):
    model, _ = small
    with pytest.raises(TypeError, match="sigma"):
        cls(model)
    with pytest.raises(ValueError, match="^sigma is required"):
        cls(model, None)
    with pytest.raises(ValueError, match="^sigma is required"):
        cls(model, sigma=None)
    with pytest.raises(TypeError, match="sigma"):
        probust.make_estimator(cls(model, 0.1).method, model)
    with pytest.raises(ValueError, match="^sigma is required"):
        probust.make_estimator(cls(model, 0.1).method, model, None)


@pytest.mark.parametrize("cls", [probust.MonteCarlo, probust.MMSE])
def test_bad_n_samples_is_refused(small, cls):
    model, _ = small
    with pytest.raises(ValueError, match="n_samples"):
        cls(model, 0.1, n_samples=0)


def test_target_out_of_range_is_refused(small):
    model, x = small
    with pytest.raises(ValueError, match="target"):
        probust.Taylor(model, 0.1)(x, target=torch.full((5,), 7))
