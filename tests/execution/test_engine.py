"""The execution object (probust.execution.Execution): the same numbers whichever way the settings
are given, plans shared through the model and not the estimator, no state carried between models."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from torch import nn

import probust
from probust.errors import OptionError
from probust.execution import Execution
from probust.models import build
from probust.smoothing import Certify, Predict
from tests._helpers import linear_model, points_near_boundaries

# A fixed plan (the user's rows and format).
FIXED = dict(batch_size=8, memory_budget="256MB", channels_last=False)

#: One of every estimator and smoothing procedure, built with the given keyword arguments.
BUILDERS = {
    "mc": lambda model, **kw: probust.MonteCarlo(model, 0.3, n_samples=200, **kw),
    "taylor": lambda model, **kw: probust.Taylor(model, 0.3, **kw),
    "mmse": lambda model, **kw: probust.MMSE(model, 0.3, n_samples=4, **kw),
    "mc_cv": lambda model, **kw: probust.MonteCarloCV(model, 0.3, n_samples=200, **kw),
    "mc_is": lambda model, **kw: probust.MonteCarloIS(model, 0.3, n_samples=200, **kw),
    "softmax": lambda model, **kw: probust.Softmax(model, **kw),
    "certify": lambda model, **kw: Certify(model, 0.3, n0=20, n=200, **kw),
    "predict": lambda model, **kw: Predict(model, 0.3, n=200, **kw),
}


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return bool(torch.equal(a.nan_to_num(posinf=1e300, neginf=-1e300), b.nan_to_num(posinf=1e300, neginf=-1e300)))


@pytest.mark.parametrize("name", list(BUILDERS))
def test_every_method_runs_by_the_execution_it_is_given_with_the_same_numbers(name):
    model = linear_model(6, 5, seed=1)
    x = points_near_boundaries(model, 7, 0.3)
    given = Execution(jacobian="loop", **FIXED)
    fixed, measured = BUILDERS[name](model, seed=3, execution=given), BUILDERS[name](model, seed=3)
    assert fixed.execution is given and measured.execution == Execution()
    first, second = fixed(x), measured(x)
    if name in ("certify", "predict"):
        assert _same(first.prediction, second.prediction) and _same(first.n_drawn, second.n_drawn)
    elif name in ("mc", "softmax"):  # counts of noisy predictions, or the logits: the same bits
        assert _same(first.p, second.p), name
    else:  # the Jacobian strategy and memory format change float rounding only
        torch.testing.assert_close(first.p, second.p, rtol=0, atol=1e-6)


@pytest.mark.parametrize("name", list(BUILDERS))
def test_a_setting_of_how_the_work_runs_given_as_a_keyword_is_refused_naming_execution(name):
    model = nn.Linear(4, 3)
    for field in dataclasses.fields(Execution):
        with pytest.raises(
            TypeError,
            match=rf"takes {field.name} through execution=: .*\(\.\.\., execution=probust\.Execution\({field.name}=\.\.\.\)\)",
        ):
            BUILDERS[name](model, **{field.name: field.default})
    with pytest.raises(ValueError, match="^execution: must be a probust.Execution") as error:
        BUILDERS[name](model, execution={"batch_size": 4})
    assert error.value.field == "execution"


@pytest.mark.parametrize(
    ("setting", "value", "match"),
    [
        ("batch_size", 0, "^batch_size: "),
        ("memory_budget", "lots", "^memory_budget: "),
        ("channels_last", "yes", "^channels_last: "),
        ("jacobian", "reverse", "^jacobian: must be one of"),
        ("class_chunk_size", 1.5, "^class_chunk_size: "),
        ("show_progress", "yes", "^show_progress: must be True or False"),
    ],
)
def test_bad_settings_are_refused_by_name(setting, value, match):
    """An OptionError (a ValueError) whose field is the setting's name."""
    with pytest.raises(OptionError, match=match) as error:
        Execution(**{setting: value})
    assert error.value.field == setting


def test_an_execution_holds_settings_only_and_cannot_change():
    given = Execution(batch_size=4, jacobian="vmap")
    assert [f.name for f in dataclasses.fields(given)] == [
        "batch_size",
        "memory_budget",
        "channels_last",
        "jacobian",
        "class_chunk_size",
        "show_progress",
    ]
    with pytest.raises(dataclasses.FrozenInstanceError):
        given.batch_size = 8  # type: ignore[misc]
    assert hash(given) == hash(Execution(batch_size=4, jacobian="vmap"))
    assert given.replace(batch_size=8) == Execution(batch_size=8, jacobian="vmap")
    with pytest.raises(ValueError, match="^batch_size: "):
        given.replace(batch_size=-1)


def test_assigning_a_setting_on_one_estimator_leaves_a_shared_execution_alone():
    model = nn.Linear(4, 3)
    shared = Execution(batch_size=4)
    first, second = probust.Taylor(model, 0.1, execution=shared), probust.MMSE(model, 0.1, execution=shared)
    first.batch_size = 16
    assert first.execution == Execution(batch_size=16) and first.batch_size == 16
    assert second.execution is shared and shared.batch_size == 4


def test_no_state_is_carried_from_one_model_to_another():
    x = points_near_boundaries(linear_model(6, 5, seed=1), 6, 0.3)
    shared = Execution(batch_size=4, channels_last=False)
    estimator = probust.Taylor(linear_model(6, 5, seed=1), 0.3, execution=shared)
    estimator(x)
    # The same estimator, the same Execution, another model: the numbers of a fresh estimator.
    other = linear_model(6, 7, seed=5)
    estimator.model = other
    fresh = probust.Taylor(other, 0.3, execution=Execution(batch_size=4, channels_last=False))(x)
    moved = estimator(x)
    assert moved.z.shape == (6, 7)
    assert torch.equal(moved.p, fresh.p) and torch.equal(moved.z, fresh.z)
    assert shared == Execution(batch_size=4, channels_last=False)  # nothing was written into it
    assert set(vars(estimator)) >= {"execution", "model"}
    assert not any(isinstance(value, dict) for value in vars(estimator).values())  # no caches on it


def test_the_linearisation_of_monte_carlo_variants_runs_by_the_outer_execution():
    model = nn.Linear(4, 3)
    given = Execution(batch_size=7, memory_budget="1GB", jacobian="loop", class_chunk_size=2)
    outer = probust.MonteCarloCV(model, 0.2, execution=given)
    assert outer.execution is given  # its noisy copies: 7 rows per pass
    assert outer.linear.execution == given.replace(batch_size=None)  # the Jacobian's rows: declared


def test_forward_mode_passes_run_at_least_a_few_rows_within_the_budget():
    from probust.execution import engine
    from probust.execution.budget import row_cost
    from probust.linearisation import JacobianPlan

    model = build("cnn", num_classes=10).eval()
    x = torch.rand(4, 1, 28, 28)
    one_row = JacobianPlan("loop", 1, None, False)
    assert Execution().forward_mode_rows(model, x, one_row) == engine.FORWARD_MODE_ROWS["cpu"]
    wide = JacobianPlan("loop", 64, None, False)
    assert Execution().forward_mode_rows(model, x, wide) == 64  # never fewer than the reverse-mode plan's
    assert Execution(batch_size=3).forward_mode_rows(model, x, one_row) == 3  # the user's bound holds
    three_rows = 3 * 2 * row_cost(model, engine.Inputs.of(x)).inference
    assert Execution(memory_budget=three_rows).forward_mode_rows(model, x, one_row) == 3  # as many as fit


def test_pullbacks_of_a_forward_mode_plan_run_a_reverse_mode_pass_of_rows():
    # A forward-mode plan's rows are sized for a tangent per input coordinate (often 1): the
    # routes' pullbacks (and the points linearised together) would then go one point at a time.
    from probust.execution import engine
    from probust.linearisation import JacobianPlan

    model = linear_model(784, 1000, seed=0)
    x = torch.rand(4, 784)
    forward = JacobianPlan("forward", 1, 600, False)
    # A budget of its own: the default follows the free memory, which other work on the machine
    # can bring below 5 passes' worth (156 rows of 160 were seen).
    ample = Execution(memory_budget=2**32)
    assert ample.pull_rows(model, x, forward) == engine.DEFAULT_JACOBIAN_ROWS
    # MMSE's copies of a point share its pass: the default counts points.
    assert ample.pull_rows(model, x, forward, copies=5) == 5 * engine.DEFAULT_JACOBIAN_ROWS
    user_rows = JacobianPlan("forward", 2, 600, False)  # what batch_size=2 makes the plan
    assert Execution(batch_size=2).pull_rows(model, x, user_rows) == 2  # the user's bound holds
    loop = JacobianPlan("loop", 5, None, False)
    assert Execution().pull_rows(model, x, loop) == 5  # a reverse-mode plan's own rows
    assert Execution().pull_rows(model, x, loop, copies=5) == 25  # ... as points of MMSE's copies
    assert Execution(batch_size=5).pull_rows(model, x, loop, copies=5) == 5


def test_a_pass_of_pullbacks_keeps_the_graph_of_the_rows_that_fit():
    from probust.execution.budget import row_cost
    from probust.execution.engine import Inputs
    from probust.linearisation import JacobianPlan

    model = linear_model(784, 1000, seed=0)
    x = torch.rand(4, 784)
    per_row = row_cost(model, Inputs.of(x)).backward
    plan = JacobianPlan("loop", 2, None, False)  # sized for every class's gradient: 2 rows
    assert Execution(memory_budget=2 * 7 * per_row).graph_rows(model, x, plan) == 7
    assert Execution(memory_budget=2 * per_row).graph_rows(model, x, plan) == 2  # never below the plan's
    assert Execution(batch_size=3).graph_rows(model, x, plan) == 3  # the user's bound holds


def test_the_estimators_door_gives_the_model_s_classes_and_each_device_kind_s_declared_costs():
    from probust.linearisation import counting as cost_model

    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 7)).eval()
    assert Execution.classes(model, torch.zeros(2, 3, 4)) == 7
    for device, kind in ((torch.device("cpu"), "cpu"), (torch.device("cuda", 1), "cuda"), (torch.device("mps"), "cpu")):
        costs = Execution.declared_costs(device)
        assert costs.jvp == cost_model.JVP_IN_PULLS[kind]
        assert costs.share == cost_model.SCREENING_SHARE[kind]
        assert costs.spectral_stages == cost_model.SPECTRAL_STAGES[kind]
    # The two kinds differ, so the test tells them apart.
    assert Execution.declared_costs(torch.device("cuda")) != Execution.declared_costs(torch.device("cpu"))
