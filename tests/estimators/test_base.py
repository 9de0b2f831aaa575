"""The call convention every estimator shares: eval mode, bad inputs and arguments refused by name.

(:mod:`tests.estimators.test_contract` proves the same for every registered method.)"""

from __future__ import annotations

import itertools
import math

import pytest
import torch
from torch import nn

import probust
from probust.estimators.base import plan_blocks
from probust.execution import Execution
from tests._helpers import NonFiniteAbove, linear_model


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
    with pytest.raises(ValueError, match="^sigma: required"):
        cls(model, None)
    with pytest.raises(ValueError, match="^sigma: required"):
        cls(model, sigma=None)
    with pytest.raises(TypeError, match="sigma"):
        probust.make_estimator(cls(model, 0.1).method, model)
    with pytest.raises(ValueError, match="^sigma: required"):
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


# ---- NaN or inf logits on noisy copies ---------------------------------------------------------

NOISY_ESTIMATORS = {
    "mc": lambda m, s: probust.MonteCarlo(m, s, n_samples=400, execution=Execution(batch_size=300)),
    "mc_adaptive": lambda m, s: probust.MonteCarlo(
        m, s, n_samples=400, target_half_width=1e-3, check_every=400, execution=Execution(batch_size=300)
    ),
    "mc_cv": lambda m, s: probust.MonteCarloCV(
        m, s, n_samples=400, linearisation="taylor", execution=Execution(batch_size=300)
    ),
    "mc_is": lambda m, s: probust.MonteCarloIS(
        m, s, n_samples=400, linearisation="taylor", execution=Execution(batch_size=300)
    ),
}


def _threshold_model(value: float) -> tuple[NonFiniteAbove, torch.Tensor, float]:
    """A linear model that gives a non-finite logit where x_0 > 1, and 3 points of which only
    row 1 (x_0 = 1 - sigma) has noisy copies beyond the threshold (about 16% of them)."""
    sigma = 0.5
    model = NonFiniteAbove(linear_model(6, 3, seed=4), threshold=1.0, value=value)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2)) * 0.1
    x[:, 0] = torch.tensor([1.0 - 40 * sigma, 1.0 - sigma, 1.0 - 40 * sigma])
    return model, x, sigma


@pytest.mark.parametrize("value", [float("nan"), float("inf"), -float("inf")], ids=["nan", "inf", "-inf"])
@pytest.mark.parametrize("method", list(NOISY_ESTIMATORS))
def test_non_finite_logits_on_noisy_copies_are_refused_naming_point_noise_and_count(method, value):
    model, x, sigma = _threshold_model(value)
    estimator = NOISY_ESTIMATORS[method](model, sigma)
    with pytest.raises(ValueError, match="NaN or inf logits on noisy copies") as error:
        estimator(x, index_offset=40)
    message = str(error.value)
    # Only row 1 (data-set index 40 + 1) has failing copies: the model's own tally is its count.
    assert 0 < model.nonfinite < 400, model.nonfinite
    assert f"point 41: {model.nonfinite} of 400 copies" in message, message
    assert "point 40" not in message and "point 42" not in message
    assert "gaussian sigma=0.5" in message


@pytest.mark.parametrize("method", list(NOISY_ESTIMATORS))
def test_finite_models_give_bitwise_the_same_estimates_through_the_check(method):
    # The wrapper with a threshold no copy reaches is the plain model: every number must agree.
    inner = linear_model(6, 3, seed=4)
    x = torch.randn(3, 6, generator=torch.Generator().manual_seed(2)) * 0.3
    plain = NOISY_ESTIMATORS[method](inner, 0.5)(x, index_offset=40)
    wrapped = NOISY_ESTIMATORS[method](NonFiniteAbove(inner, threshold=math.inf, value=math.nan), 0.5)(
        x, index_offset=40
    )
    for field in ("p", "ci_low", "ci_high", "stderr", "n_samples", "p_fail"):
        a, b = getattr(plain, field), getattr(wrapped, field)
        assert (a is None and b is None) or torch.equal(a, b), field
    assert ((plain.p > 0.02) & (plain.p < 0.98)).any(), "the points should not be trivially robust"


def test_mmse_refuses_non_finite_logits_on_its_noisy_copies():
    model, x, sigma = _threshold_model(float("nan"))
    # 200 copies of a point with P(x_0 + eps_0 > 1) ~ 0.16: some copy fails (1 - 0.84^200 ~ 1).
    for estimator in (
        probust.MMSE(model, sigma, n_samples=200, execution=Execution(batch_size=64)),
        probust.MonteCarloCV(model, sigma, n_samples=400, mmse_samples=200, execution=Execution(batch_size=300)),
    ):
        with pytest.raises(ValueError, match=r"noisy copies x \+ eps of MMSE's linearisation") as error:
            estimator(x, index_offset=40)
        assert "points [41]" in str(error.value) and "gaussian sigma=0.5" in str(error.value)


@pytest.mark.parametrize(
    "points, samples, rows", list(itertools.product([1, 3, 7], [1, 5, 64, 100], [1, 4, 64, 130, 1000]))
)
def test_plan_blocks_covers_every_point_and_sample_exactly_once_within_rows(points, samples, rows):
    seen = torch.zeros(points, samples, dtype=torch.int64)
    for block, first, count in plan_blocks(points, samples, rows):
        assert count >= 1 and first >= 0 and first + count <= samples
        n_points = len(range(points)[block])
        assert n_points >= 1 and n_points * count <= rows
        seen[block, first : first + count] += 1
    assert (seen == 1).all()
