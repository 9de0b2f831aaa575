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
from probust.execution import tuning as _tuning
from probust.models import build
from probust.smoothing import Certify, Predict
from tests._helpers import linear_model, points_near_boundaries

# Fixed plans (no timing): the keyword arguments and the Execution must give identical bits.
FIXED = dict(batch_size=8, memory_budget="256MB", channels_last=False)


def _estimators(model: nn.Module, sigma: float, linearising: dict, **settings):
    """One of every estimator, with ``settings`` as its execution (keywords or ``execution=``);
    ``linearising``: the keywords only the estimators that differentiate take (``jacobian``)."""
    both = {**settings, **linearising}
    return {
        "mc": probust.MonteCarlo(model, sigma, n_samples=200, seed=3, **settings),
        "taylor": probust.Taylor(model, sigma, seed=3, **both),
        "taylor_mvs": probust.Taylor(model, sigma, cdf="mv-sigmoid", **both),
        "mmse": probust.MMSE(model, sigma, n_samples=4, seed=3, **both),
        "mc_cv": probust.MonteCarloCV(model, sigma, n_samples=200, seed=3, **both),
        "mc_is": probust.MonteCarloIS(model, sigma, n_samples=200, seed=3, **both),
        "softmax": probust.Softmax(model, **settings),
    }


def _same(a: torch.Tensor | None, b: torch.Tensor | None) -> bool:
    if a is None or b is None:
        return a is b
    return bool(torch.equal(a.nan_to_num(posinf=1e300, neginf=-1e300), b.nan_to_num(posinf=1e300, neginf=-1e300)))


def test_an_execution_given_whole_gives_the_numbers_of_the_keyword_arguments():
    model = linear_model(6, 5, seed=1)
    x = points_near_boundaries(model, 7, 0.3)
    by_keywords = _estimators(model, 0.3, {"jacobian": "loop"}, **FIXED)
    given = Execution(jacobian="loop", **FIXED)
    by_object = _estimators(model, 0.3, {}, execution=given)
    for name, estimator in by_keywords.items():
        loop = name not in ("mc", "softmax")  # the others take no jacobian: theirs stays "auto"
        assert by_object[name].execution == given, name
        assert estimator.execution == (given if loop else given.replace(jacobian="auto")), name
        first, second = estimator(x), by_object[name](x)
        for field in ("p", "z", "margin", "cdf_error", "stderr", "ci_low", "ci_high", "p_fail"):
            assert _same(getattr(first, field), getattr(second, field)), (name, field)


def test_randomized_smoothing_takes_an_execution_too():
    model = linear_model(6, 3, seed=2)
    x = torch.randn(5, 6)
    given = Execution(**FIXED)
    for cls, options in ((Certify, dict(n0=20, n=200)), (Predict, dict(n=200))):
        by_keywords = cls(model, 0.3, **options, **FIXED)(x)
        by_object = cls(model, 0.3, **options, execution=given)(x)
        assert torch.equal(by_keywords.prediction, by_object.prediction)
        assert torch.equal(by_keywords.n_drawn, by_object.n_drawn)


def test_the_settings_are_given_once():
    model = nn.Linear(4, 3)
    given = Execution(batch_size=4)
    for keyword in (dict(batch_size=8), dict(memory_budget="1GB"), dict(channels_last=False)):
        with pytest.raises(OptionError, match=f"^execution: given together with {next(iter(keyword))}:") as error:
            probust.MonteCarlo(model, 0.1, execution=given, **keyword)
        assert error.value.field == "execution"
    for keyword in (dict(jacobian="loop"), dict(class_chunk_size=2)):
        with pytest.raises(OptionError, match=f"^execution: given together with {next(iter(keyword))}:"):
            probust.Taylor(model, 0.1, execution=given, **keyword)
    with pytest.raises(ValueError, match="^execution: must be"):
        probust.Taylor(model, 0.1, execution={"batch_size": 4})  # type: ignore[arg-type]
    # Keywords at their defaults are no second setting.
    assert probust.Taylor(model, 0.1, execution=given, jacobian="auto").execution is given


@pytest.mark.parametrize(
    ("setting", "value", "match"),
    [
        ("batch_size", 0, "^batch_size: "),
        ("memory_budget", "lots", "^memory_budget: "),
        ("channels_last", "yes", "^channels_last: "),
        ("jacobian", "reverse", "^jacobian: must be one of"),
        ("class_chunk_size", 1.5, "^class_chunk_size: "),
    ],
)
def test_bad_settings_are_refused_by_name(setting, value, match):
    """An OptionError (a ValueError) whose field is the setting's name, as an estimator's keyword too."""
    with pytest.raises(OptionError, match=match) as error:
        Execution(**{setting: value})
    assert error.value.field == setting
    with pytest.raises(OptionError) as error:
        probust.Taylor(nn.Linear(4, 3), 0.1, **{setting: value})
    assert error.value.field == setting


def test_an_execution_holds_settings_only_and_cannot_change():
    given = Execution(batch_size=4, jacobian="vmap")
    assert [f.name for f in dataclasses.fields(given)] == [
        "batch_size",
        "memory_budget",
        "channels_last",
        "jacobian",
        "class_chunk_size",
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


def test_estimators_sharing_an_execution_share_the_models_plans(monkeypatch):
    # Every timing reads 0.1 ms (nothing runs): a real clock on a loaded machine (another test
    # worker) could leave the first call's plan unfinished, and the second call would time the rest.
    calls = []
    monkeypatch.setattr(_tuning, "_seconds", lambda run, device: calls.append(1) or 1e-4)
    torch.manual_seed(0)
    model = build("cnn", 10, (1, 12, 12)).eval()
    x = torch.rand(300, 1, 12, 12)  # enough work to be worth measuring
    shared = Execution(memory_budget="1GB")
    first = probust.Taylor(model, 0.2, execution=shared)(x)
    assert calls  # measured on the first call
    measured = len(calls)
    second = probust.Taylor(model, 0.2, execution=shared)(x)
    assert len(calls) == measured  # the plan is the model's: found, not measured again
    assert torch.equal(first.p, second.p)


def test_no_state_is_carried_from_one_model_to_another(monkeypatch, tmp_path):
    monkeypatch.setenv("PROBUST_CACHE_DIR", str(tmp_path))
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
    outer = probust.MonteCarloCV(
        model, 0.2, execution=Execution(memory_budget="1GB", jacobian="loop", class_chunk_size=2), jacobian_batch_size=5
    )
    assert outer.linear.execution == Execution(batch_size=5, memory_budget="1GB", jacobian="loop", class_chunk_size=2)
    assert outer.execution.batch_size is None  # the noisy copies' rows stay measured


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
    three_rows = 3 * 2 * row_cost(model, engine.Inputs.of(x, 1)).inference
    assert Execution(memory_budget=three_rows).forward_mode_rows(model, x, one_row) == 3  # as many as fit


def test_pullbacks_of_a_forward_mode_plan_run_a_reverse_mode_pass_of_rows():
    # A forward-mode plan's rows are sized for a tangent per input coordinate (often 1): the
    # routes' pullbacks (and the points linearised together) would then go one point at a time.
    from probust.execution import engine
    from probust.linearisation import JacobianPlan

    model = linear_model(784, 1000, seed=0)
    x = torch.rand(4, 784)
    forward = JacobianPlan("forward", 1, 600, False)
    assert Execution().pull_rows(model, x, forward) == engine.DEFAULT_JACOBIAN_ROWS
    # MMSE's copies of a point share its pass: the default counts points.
    assert Execution().pull_rows(model, x, forward, copies=5) == 5 * engine.DEFAULT_JACOBIAN_ROWS
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
    per_row = row_cost(model, Inputs.of(x, 1)).backward
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


@pytest.mark.parametrize("method", ["taylor", "mmse"])
def test_a_warm_call_finds_its_plans_by_the_batch_s_description_and_draws_none_of_its_rows(monkeypatch, method):
    # Below the door the row cost and the plans see the batch as Inputs: a known plan is found by
    # its description; rows are drawn (the real inputs, which the timings run on) only to measure.
    from probust.execution import engine

    drawn: list[int] = []
    cycled = engine._cycled
    monkeypatch.setattr(engine, "_cycled", lambda x, count: (drawn.append(count), cycled(x, count))[1])
    torch.manual_seed(0)
    model = build("cnn", 200, (1, 12, 12)).eval()
    x = torch.rand(24, 1, 12, 12)
    kind = probust.Taylor if method == "taylor" else probust.MMSE
    estimator = kind(model, 0.3)
    first = estimator(x).p
    assert drawn  # the first call measured on the batch's own rows (its row cost at least)
    drawn.clear()
    again = estimator(x).p
    assert drawn == []
    assert torch.equal(first, again)
