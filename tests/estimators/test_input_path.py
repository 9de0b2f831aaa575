"""A Taylor or MMSE call a newcomer can follow (issue 34): the input enters at most 8 modules, the
plan (``probust.execution``) and the mvn-cdf each entered only through their package's door, and
the maths never call back into execution. Measured by ``benchmarks/walk.py``, run here."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest
import torch

from probust import _user_model

_WALK = Path(__file__).resolve().parents[2] / "benchmarks" / "walk.py"


@pytest.fixture(scope="module")
def walk():
    spec = importlib.util.spec_from_file_location("benchmark_walk", _WALK)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


@pytest.mark.parametrize(("method", "classes"), [("taylor", 10), ("taylor", 1000), ("mmse", 10), ("mmse", 1000)])
def test_the_input_enters_at_most_eight_modules_and_the_maths_never_call_back_into_execution(walk, method, classes):
    summary = walk.walk(method, classes)
    path = summary["path_modules"]
    # The steps of docs/design.md's diagram that the input itself goes through: not vacuous.
    for step in (
        "probust.estimators.base",
        "probust.estimators.linearised",
        "probust.linearisation.routes",
        "probust.linearisation.pullback",
    ):
        assert step in path
    # A warm call keeps its plan and reads execution's budget by x's device: x never goes there.
    assert not any(module.startswith("probust.execution") for module in path)
    assert summary["bypasses"] == {"probust.execution": set(), "probust.linearisation": set(), "probust.mvn": set()}
    # Module by module, each package entered only through its door (execution, linearisation,
    # mvn) counted as one.
    assert walk.count(path, summary["bypasses"]) <= 8, path
    assert sum(summary["climbs"].values()) == 0
    assert sum(summary["late"].values()) == 0


def test_a_call_past_a_package_door_is_seen(walk):
    # How the estimator reached the row cost and the cost model before the door: each is a bypass,
    # and the package then counts module by module.
    edges = [
        ("probust.estimators.linearised", "probust.execution.engine", "Execution.points_per_chunk"),
        ("probust.estimators.linearised", "probust.execution.budget", "row_cost"),
        ("probust.estimators.linearised", "probust.execution.plans", "plan_jacobian"),
        ("probust.estimators.maps", "probust.mvn.cdf", "mvn_cdf"),
    ]
    summary = walk.summarise(edges)
    assert summary["bypasses"]["probust.execution"] == {
        "probust.execution.budget.row_cost",
        "probust.execution.plans.plan_jacobian",
    }
    assert summary["bypasses"]["probust.mvn"] == set()
    modules = [callee for _, callee, _ in edges]
    assert walk.count(modules, summary["bypasses"]) == 4  # execution's three modules, mvn as one


def test_the_input_is_followed_through_layouts_and_noise_but_not_into_gradients(walk):
    x = torch.randn(2, 3, 4, 4, requires_grad=True)

    def call() -> None:
        _user_model.to_format((x[:1] + torch.randn(1, 3, 4, 4)).contiguous(), True)  # a noisy copy's row
        _user_model.to_format(torch.zeros_like(x), True)  # shaped like it, not its values
        (gradient,) = torch.autograd.grad((x * x).sum(), x)
        _user_model.to_format(gradient, True)  # another quantity in the input's space

    hits = walk.follow(call, x, keep_housekeeping=False)
    assert hits == [("probust._user_model", "to_format")]


#: Issue 51's measure of the four warm calls, counted as the issue does (housekeeping included):
#: each enters at most 15 probust modules outside probust.mvn and changes module at most 150
#: times (docs/design.md).
WARM_CALLS = (("taylor", 10), ("taylor", 1000), ("mmse", 10), ("mmse", 1000))


@pytest.mark.parametrize(("method", "classes"), WARM_CALLS)
def test_a_warm_call_stays_down_in_few_modules_and_few_changes_of_module(walk, method, classes):
    modules, changes = walk.walk(method, classes, keep_housekeeping=True)["outside_mvn"]
    assert changes <= 150, changes
    assert modules <= 15, modules
