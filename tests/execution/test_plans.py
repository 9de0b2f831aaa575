"""Declared plans (probust.execution.plans): the first call on a model runs the passes of the
second, nothing is timed, the rules give what docs/performance.md ("Declared plans") states, and
every Jacobian strategy, row count and memory format gives the same numbers."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from torch import nn

import probust
from probust import _user_model
from probust.execution import Execution
from probust.execution import plans as _plans
from probust.execution.budget import MemoryBudgetError, row_cost
from probust.execution.engine import Inputs
from probust.linearisation.margins import logit_jacobian
from probust.models import build
from probust.smoothing import Certify

METHODS = {
    "mc": lambda model: probust.MonteCarlo(model, 0.05, n_samples=300),
    "taylor": lambda model: probust.Taylor(model, 0.05),
    "mmse": lambda model: probust.MMSE(model, 0.05, n_samples=4),
    "certify": lambda model: Certify(model, 0.05, n0=20, n=300),
}


class _Passes:
    """The rows of every pass through ``model`` (its forward hook), in order."""

    def __init__(self, model: nn.Module) -> None:
        self.rows: list[int] = []
        model.register_forward_hook(lambda module, args, out: self.rows.append(int(args[0].shape[0])))


@pytest.mark.parametrize("method", list(METHODS))
def test_the_first_call_runs_the_passes_of_the_second_and_two_passes_of_two_rows(method):
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    passes = _Passes(model)
    x = torch.rand(40, 1, 12, 12)
    estimator = METHODS[method](model)
    first = estimator(x)
    first_rows = list(passes.rows)
    passes.rows.clear()
    second = estimator(x)
    number = "radius" if method == "certify" else "p"
    assert torch.equal(getattr(first, number), getattr(second, number))
    # What the first call adds, nothing timed: the model contract's probe (the first 2 rows: are
    # these logits?), the row cost's pass (two copies of the first row: the bytes the plans are
    # declared by) and, for the linearised methods, forward mode's one-row probe (does it run?).
    added = Counter(first_rows) - Counter(passes.rows)
    assert Counter(first_rows) - added == Counter(passes.rows)
    expected = {2: 2, 1: 1} if method in ("taylor", "mmse") else {2: 2}
    assert added == Counter(expected), (first_rows, passes.rows)


def test_forward_rows_are_the_power_of_two_whose_largest_activation_is_nearest_below_16_mb():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 28, 28)).eval()
    x = torch.rand(3, 1, 28, 28)
    plan = Execution().forward_plan(model, x)
    cost = row_cost(model, Inputs.of(x))
    assert plan.rows & (plan.rows - 1) == 0 and _plans.MIN_FORWARD_ROWS <= plan.rows <= _plans.MAX_FORWARD_ROWS
    assert plan.rows * cost.largest <= _plans.FORWARD_PASS_BYTES or plan.rows == _plans.MIN_FORWARD_ROWS
    assert 2 * plan.rows * cost.largest > _plans.FORWARD_PASS_BYTES or plan.rows == _plans.MAX_FORWARD_ROWS
    assert plan.channels_last  # a convolutional net's forward passes run in channels_last
    assert not Execution(channels_last=False).forward_plan(model, x).channels_last
    assert Execution().forward_plan(nn.Linear(5, 3), torch.rand(2, 5)) == _plans.ForwardPlan(4096, False)
    tight = Execution(memory_budget=cost.inference * 20).forward_plan(model, x)
    assert tight.rows == 20  # cut to what the budget holds


def test_the_jacobian_is_the_loop_on_a_cpu_in_the_model_s_format_and_the_user_s_settings_hold():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(3, 1, 12, 12)
    plan = Execution().jacobian_plan(model, x, 1000)
    assert (plan.strategy, plan.rows, plan.class_chunk, plan.channels_last) == ("loop", 32, None, False)
    assert Execution().jacobian_plan(model, x, 5).rows == 5
    given = Execution(batch_size=6, jacobian="vmap", channels_last=True).jacobian_plan(model, x, 1000)
    assert (given.strategy, given.rows, given.channels_last) == ("vmap", 6, True)
    assert not Execution(channels_last=True).jacobian_plan(model, x, 10, differentiable=True).channels_last
    with pytest.raises(MemoryBudgetError, match="batch_size"):
        Execution(batch_size=10**6, memory_budget="1MB").jacobian_plan(model, x, 1000)
    with pytest.raises(MemoryBudgetError, match="batch_size"):
        Execution(batch_size=10**6, memory_budget="1MB").forward_plan(model, x)


def test_estimators_sharing_an_execution_get_the_same_plans_and_the_same_numbers():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(30, 1, 12, 12)
    shared = Execution(memory_budget="1GB")
    first = probust.Taylor(model, 0.05, execution=shared)(x)
    second = probust.Taylor(model, 0.05, execution=shared)(x)
    assert torch.equal(first.p, second.p)
    assert shared.forward_plan(model, x) == shared.forward_plan(model, x[:3])


#: How far two execution plans (Jacobian strategy, rows per pass, memory format) move a float32
#: model's analytic p: float rounding of its passes. Measured at most 4.2e-7 on the CNN below on a
#: 2-core Xeon (AVX-512) and 7.7e-7 on a 2-core AMD EPYC, whose MKL rounds rows of small passes
#: differently (taylor, "vmap" at 1 row per pass against "loop" at 4; benchmarks/plan_agreement.py
#: measures every method and model, docs/estimate.md "Reproducibility" quotes it).
PLAN_ATOL = 1e-6


def _mlp(d: int, classes: int, seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(d, 16), nn.Tanh(), nn.Linear(16, classes)).eval()


@pytest.mark.parametrize("strategy", ["loop", "vmap", "forward"])
def test_every_jacobian_strategy_equals_autograd_functional(strategy):
    model = _mlp(6, 9, seed=0)
    x = torch.randn(5, 6)
    logits, jac = logit_jacobian(model, x, strategy=strategy)
    expected = torch.autograd.functional.jacobian(lambda v: model(v).sum(0), x).transpose(0, 1)
    torch.testing.assert_close(logits, model(x))
    torch.testing.assert_close(jac, expected, rtol=1e-5, atol=1e-6)


def test_class_subsets_give_those_rows_of_the_jacobian():
    model = _mlp(6, 9, seed=1)
    x = torch.randn(4, 6)
    _, full = logit_jacobian(model, x, strategy="loop")
    subset = torch.tensor([2, 7])
    for strategy in ("loop", "vmap"):
        _, part = logit_jacobian(model, x, strategy=strategy, classes=subset)
        torch.testing.assert_close(part, full[:, subset], rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("method", ["taylor", "mmse"])
def test_estimates_do_not_depend_on_jacobian_strategy_or_rows(method):
    torch.manual_seed(3)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(9, 1, 12, 12)
    sigma = 0.3
    reference = probust.estimate(model, x, sigma, method, execution=Execution(jacobian="loop", batch_size=4))
    for jacobian, rows in (("vmap", 1), ("vmap", None), ("auto", 7), ("auto", None)):
        got = probust.estimate(model, x, sigma, method, execution=Execution(jacobian=jacobian, batch_size=rows))
        torch.testing.assert_close(got, reference, rtol=0, atol=PLAN_ATOL)
    # Every gradient by forward mode (another source, the same numbers up to rounding).
    got = probust.estimate(model, x, sigma, method, gradients="forward", prune="off", execution=Execution(batch_size=5))
    torch.testing.assert_close(got, reference, rtol=0, atol=PLAN_ATOL)


def test_channels_last_hands_the_weights_back_untouched():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 28, 28)).eval()
    before = {name: (p, p.data_ptr(), p.stride()) for name, p in model.named_parameters()}
    x = torch.rand(3, 1, 28, 28)
    with _user_model.weights_in_format(model, True):
        assert any(p.is_contiguous(memory_format=torch.channels_last) and p.ndim == 4 for p in model.parameters())
        inside = model(_user_model.to_format(x, True))
    for name, p in model.named_parameters():
        assert p is before[name][0] and p.data_ptr() == before[name][1] and p.stride() == before[name][2]
    torch.testing.assert_close(inside, model(x), rtol=1e-5, atol=1e-5)


def test_monte_carlo_counts_do_not_depend_on_rows_or_memory_format(monkeypatch):
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 16, 16)).eval()
    x = torch.rand(5, 1, 16, 16)
    reference = probust.MonteCarlo(model, 0.2, n_samples=400, execution=Execution(batch_size=64))(x).p
    for rows, channels_last in ((7, False), (400, True), (1000, True)):
        monkeypatch.setattr(
            probust.MonteCarlo,
            "_forward_plan",
            lambda self, x, r=rows, c=channels_last: _plans.ForwardPlan(r, c),
        )
        got = probust.MonteCarlo(model, 0.2, n_samples=400)(x).p
        # Same noise; channels_last may move a logit by float rounding, so allow one flipped draw.
        torch.testing.assert_close(got, reference, rtol=0, atol=1 / 400 + 1e-12)


@pytest.mark.parametrize("strategy", ["loop", "vmap", "forward"])
def test_margin_jacobian_equals_differences_of_logit_gradients(strategy):
    from probust.linearisation.margins import margin_jacobian

    model = _mlp(6, 5, seed=2)
    x = torch.randn(7, 6)
    full = torch.autograd.functional.jacobian(lambda v: model(v).sum(0), x).transpose(0, 1)  # [B, C, d]
    for target in (None, torch.tensor([0, 1, 2, 3, 4, 0, 4])):
        logits, t, u = margin_jacobian(model, x, target, strategy=strategy)
        expected_t = model(x).argmax(1) if target is None else target
        assert torch.equal(t, expected_t)
        expected = full[torch.arange(7), expected_t][:, None] - full
        torch.testing.assert_close(u, expected, rtol=1e-5, atol=1e-6)
        assert (u[torch.arange(7), t] == 0).all()
    _, t, u = margin_jacobian(model, x, strategy=strategy)
    _, t, first_two = margin_jacobian(model, x, strategy=strategy, limit=2)
    others = torch.stack([torch.tensor([c for c in range(5) if c != int(b)]) for b in t])
    torch.testing.assert_close(first_two, u.gather(1, others[:, :2, None].expand(-1, -1, 6)), rtol=1e-5, atol=1e-6)


def test_channels_last_can_be_fixed_either_way():
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 16, 16)).eval()
    x = torch.rand(6, 1, 16, 16)
    # sigma = 2: every p in (0.69, 0.81), so rounding in z reaches p (at 0.2 every p is 1.0).
    on = probust.Taylor(model, 2.0, execution=Execution(channels_last=True, jacobian="loop"))(x)
    off = probust.Taylor(model, 2.0, execution=Execution(channels_last=False, jacobian="loop"))(x)
    assert ((off.p > 0.5) & (off.p < 0.9)).all(), off.p
    torch.testing.assert_close(on.p, off.p, rtol=0, atol=PLAN_ATOL)  # measured 4.7e-8
    # z to float32 rounding: measured 2.3e-7 relative (two ulps)
    torch.testing.assert_close(on.z, off.z, rtol=5e-7, atol=0, equal_nan=True)
    with pytest.raises(ValueError, match="channels_last"):
        probust.Taylor(model, 0.2, execution=Execution(channels_last="yes"))


@pytest.mark.parametrize(("inputs", "forward"), [(4, True), (7, False)])
def test_forward_mode_is_chosen_by_counts(inputs, forward):
    """Forward mode computes the gradients another way (a different route), so "auto" takes it by
    counts alone, at the door (:meth:`probust.execution.Execution.jacobian_plan`): D probes at the
    declared cost (1.5 pulls on a CPU) against C - 1 pulls. 4 x 1.5 < 9 takes it; 7 x 1.5 >= 9
    takes the loop."""
    model, x = _mlp(inputs, 10, seed=0), torch.randn(8, inputs)
    execution = probust.execution.Execution(memory_budget=2**30)
    plan = execution.jacobian_plan(model, x, 10_000)
    assert plan.strategy == ("forward" if forward else "loop")


def test_channels_last_is_declared_where_every_feature_map_stays_at_least_7_wide():
    # Measured (docs/performance.md, "Declared plans"): the paper's CNN at 28 x 28 (last maps
    # 7 x 7) and a ResNet at 224 x 224 run faster in channels_last; a ResNet whose last maps are
    # 4 x 4 (the CIFAR stem at 32 x 32) or 2 x 2 (torchvision's at 64 x 64) as fast or faster without.
    import torchvision

    torch.manual_seed(0)
    cases = [
        (build("cnn", 10, (1, 28, 28)), (1, 28, 28), True),
        (build("resnet18", 10, (3, 32, 32)), (3, 32, 32), False),
        (torchvision.models.resnet18(num_classes=10), (3, 64, 64), False),
        (torchvision.models.resnet18(num_classes=10), (3, 224, 224), True),
    ]
    for model, shape, expected in cases:
        x = torch.rand(2, *shape)
        cost = row_cost(model.eval(), Inputs.of(x))
        assert (cost.smallest_map >= _plans.CHANNELS_LAST_MAP) == expected, (shape, cost.smallest_map)
        assert Execution().forward_plan(model, x).channels_last == expected, shape
        assert Execution(channels_last=True).forward_plan(model, x).channels_last  # the user decides
        assert not Execution(channels_last=False).forward_plan(model, x).channels_last


def test_the_row_cost_counts_activations_not_the_weights_saved_for_backward():
    # A convolution saves its weight for backward; a 512 x 512 x 3 x 3 weight (9.4 MB) is no
    # per-row cost, and counted as one it would cut torchvision's resnet18 to 8 rows per pass.
    import torchvision

    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=10).eval()
    cost = row_cost(model, Inputs.of(torch.rand(2, 3, 64, 64)))
    assert cost.largest == 64 * 32 * 32 * 4  # the stem's output, per row
    assert Execution().forward_plan(model, torch.rand(2, 3, 64, 64)).rows == 64
