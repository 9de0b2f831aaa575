"""Taylor and MMSE ask execution for their plan once, before the maths (issue 34): once the first
chunk is linearised, no call enters ``probust.execution`` (no timing, no plan cache, no budget),
whatever the chunk, the check or the route."""

from __future__ import annotations

import sys
import warnings
from types import FrameType
from typing import Any

import pytest
import torch
from torch import nn

import probust
from probust.estimators import linearised
from probust.execution.engine import Execution

#: The estimator's linearisation of a chunk: where its maths begin.
MATHS_ENTRY = ("probust.estimators.linearised", "_routed")


def _model(classes: int) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 4, 3, padding=1),
        nn.ReLU(),
        nn.AdaptiveAvgPool2d(3),
        nn.Flatten(),
        nn.Linear(36, 16),
        nn.ReLU(),
        nn.Linear(16, classes),
    ).eval()


def _late_execution_calls(call: Any) -> tuple[int, list[str]]:
    """(chunks linearised, the execution functions entered after the first chunk began) during ``call()``."""
    chunks = 0
    late: list[str] = []

    def tracer(frame: FrameType, event: str, arg: Any) -> None:
        nonlocal chunks
        if event != "call":
            return
        module = frame.f_globals.get("__name__", "")
        if (module, frame.f_code.co_name) == MATHS_ENTRY:
            chunks += 1
        elif chunks and module.startswith("probust.execution"):
            late.append(f"{module}.{frame.f_code.co_name}")

    sys.settrace(tracer)
    try:
        call()
    finally:
        sys.settrace(None)
    return chunks, late


@pytest.mark.parametrize(
    ("method", "classes", "options"),
    [
        ("taylor", 10, {}),
        ("taylor", 10, {"check_draws": 0}),
        ("taylor", 300, {}),  # a head route, screened
        ("mmse", 10, {}),  # the check reads the copies; the targets come off clean passes
        ("mmse", 10, {"check_draws": 4}),  # fresh check draws
    ],
)
def test_no_call_enters_execution_once_the_first_chunk_is_linearised(method, classes, options, monkeypatch):
    # Three chunks, so a plan asked per chunk (the check's forward plan, the weights' format, the
    # clean passes' rows) would show after the first.
    monkeypatch.setattr(Execution, "points_per_chunk", lambda self, model, x, copies=1: 3)
    kind = probust.Taylor if method == "taylor" else probust.MMSE
    estimator = kind(_model(classes), 0.3, **options)
    x = torch.randn(7, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    result: list[probust.Estimate] = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", probust.LinearisationWarning)  # the check flags points; not at issue here
        chunks, late = _late_execution_calls(lambda: result.append(estimator(x)))
    assert chunks == 3
    assert late == []
    assert result[0].p.shape == (7,)
    if options.get("check_draws") == 0:
        assert result[0].agreement is None
    else:
        assert result[0].agreement is not None and bool((result[0].agreement_draws > 0).all())


def test_the_tracer_sees_a_plan_asked_after_the_first_chunk(monkeypatch):
    # The check above is not vacuous: an execution call made inside the loop is caught.
    monkeypatch.setattr(Execution, "points_per_chunk", lambda self, model, x, copies=1: 3)
    estimator = probust.Taylor(_model(10), 0.3)
    original = estimator._routed

    def routed_asking(*args: Any, **kwargs: Any) -> Any:
        estimator.execution.budget(args[1])
        return original(*args, **kwargs)

    monkeypatch.setattr(estimator, "_routed", routed_asking)
    x = torch.randn(7, 1, 6, 6, generator=torch.Generator().manual_seed(1))
    chunks, late = _late_execution_calls(lambda: estimator(x))
    assert chunks == 3
    assert late.count("probust.execution.engine.budget") == 2  # the second and third chunks'


def _plans_made(estimator: Any, x: torch.Tensor, monkeypatch) -> int:
    """How many times ``estimator(x)`` made a new call plan (not the kept one)."""
    made = []
    new_plan = type(estimator)._new_plan

    def counted(self, rows):
        made.append(1)
        return new_plan(self, rows)

    monkeypatch.setattr(type(estimator), "_new_plan", counted)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", probust.LinearisationWarning)
        estimator(x)
    monkeypatch.undo()
    return len(made)


@pytest.mark.parametrize("kind", [probust.Taylor, probust.MMSE])
def test_a_warm_call_keeps_its_plan_until_the_model_the_batch_a_setting_or_the_budget_moves(kind, monkeypatch):
    model = _model(10)
    x = torch.randn(6, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    estimator = kind(model, 0.3)
    assert _plans_made(estimator, x, monkeypatch) == 1
    first = estimator._kept_plan
    assert _plans_made(estimator, x, monkeypatch) == 0  # the same call again: the kept plan
    assert estimator._kept_plan is first
    assert _plans_made(estimator, x[:4], monkeypatch) == 1  # another batch shape
    estimator.tol = 1e-3
    assert _plans_made(estimator, x[:4], monkeypatch) == 1  # a setting changed after a call
    model[4] = nn.Linear(36, 16)
    assert _plans_made(estimator, x[:4], monkeypatch) == 1  # the model's structure changed
    budget = estimator._kept_plan[1]
    for factor, made in ((1.2, 0), (0.85, 0), (1.3, 1), (0.7, 1)):
        # The free memory the default budget follows, moved by this factor.
        monkeypatch.setattr(linearised, "resolve_budget", lambda memory_budget, device, b=int(budget * factor): b)
        assert _plans_made(estimator, x[:4], monkeypatch) == made, factor
        monkeypatch.undo()
        estimator._kept_plan = (estimator._kept_plan[0], budget, estimator._kept_plan[2])


def test_a_kept_plan_gives_the_numbers_a_new_plan_gives():
    model = _model(10)
    x = torch.randn(6, 1, 6, 6, generator=torch.Generator().manual_seed(0))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", probust.LinearisationWarning)
        warm = probust.MMSE(model, 0.3)
        warm(x)
        again = warm(x)
        fresh = probust.MMSE(model, 0.3)(x)
    assert torch.equal(again.p, fresh.p)
    assert torch.equal(again.route, fresh.route)
