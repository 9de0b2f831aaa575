"""How to differentiate a model fast within a memory budget: loop or vmap (or forward mode where
asked), rows per pass, class chunks and memory format, measured as :mod:`probust.execution.tuning`
measures the forward plans (a few timed passes of the call's own work, within its planning share)
and kept per model structure, device, input shape and classes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import TYPE_CHECKING

from torch import Tensor, nn

# The clock and torch.func's start-up are read through tuning, which owns them for forward and
# Jacobian plans alike (and where the tests replace them): tuning._seconds, not a copy of it.
from probust.execution import tuning
from probust.execution.budget import RowCost, row_cost, rows_within
from probust.execution.tuning import (
    _TIMED_CALLS,
    _Allowance,
    _cached,
    _first_timing,
    _paired,
    _remember,
    can_use_channels_last,
    too_many,
)
from probust.linearisation import JacobianPlan, Strategy, cannot_trace

if TYPE_CHECKING:  # the door's description of a batch; the door imports this module
    from probust.execution.engine import Inputs

_MAX_JACOBIAN_ROWS = 256
DEFAULT_JACOBIAN_ROWS = 32
_TRIAL_ROWS = 4  # rows of a timed Jacobian pass
_CALIBRATION_CLASSES = 2  # margins (or tangents) per timed call; cost is linear in them
#: On a CPU vmap is taken only where it costs at most this share of the loop per cotangent: what is
#: timed, a trial of a few rows, flatters it (:func:`_measure_jacobian`).
VMAP_PAYS = 2 / 3

__all__ = ["DEFAULT_JACOBIAN_ROWS", "jacobian_row_bytes", "plan_jacobian"]


def jacobian_row_bytes(cost: RowCost, strategy: Strategy | str, classes: int, class_chunk: int | None) -> int:
    """Bytes per row of one Jacobian pass: the pass itself and the [C, *S] Jacobian it returns
    (about three copies of it live at once: per-class gradients, the stacked Jacobian and
    the margin gradients made from it)."""
    jacobian = 3 * classes * cost.input
    strategy = Strategy(strategy)
    if strategy is Strategy.LOOP:
        return cost.backward + jacobian
    chunk = classes if class_chunk is None else class_chunk
    if strategy is Strategy.VMAP:
        return cost.saved + chunk * (3 * cost.largest + 2 * cost.input) + jacobian
    return 2 * chunk * (3 * cost.largest + 2 * cost.input) + jacobian  # forward mode


def plan_jacobian(
    model: nn.Module,
    inputs: Inputs,
    classes: int,
    *,
    budget: int,
    total_rows: int,
    strategy: str = "auto",
    rows: int | None = None,
    class_chunk: int | None = None,
    channels_last: bool | None = None,
    differentiable: bool = False,
    run: Callable[[JacobianPlan, Tensor, int], object],
    passes: int | None = None,
    work: str = "margins",
) -> JacobianPlan:
    """The fastest way to get the [C, *S] input Jacobian of ``total_rows`` rows within ``budget``.

    Args:
        model: in eval mode.
        inputs: the batch as the door describes it (timings are taken on its rows).
        classes: C, the number of logits.
        budget: bytes the passes may hold.
        total_rows: rows the caller will differentiate; tiny jobs get a default plan.
        strategy: "auto" (loop or vmap, timed), or a :class:`~probust.linearisation.Strategy`
            used as given (forward mode: :meth:`probust.execution.Execution.jacobian_plan`).
        rows: the user's rows per pass (checked against the budget).
        class_chunk: classes per vmapped pass (vmap); None chooses from the budget.
        channels_last: the user's choice of format; None measures it (off when differentiable).
        differentiable: the Jacobian must keep its graph (forward mode is not offered).
        run: ``run(plan, rows, k)``: the call's own work on ``rows`` for k margins (or cotangents),
            which is what is timed.
        passes: backward passes per row the call will run (default C - 1; fewer where the
            caller prunes): sizes the work whose :data:`PLANNING_SHARE` the measuring may cost.
        work: names what ``run`` does, in the plan's key: plans of different work are timed and
            kept apart.
    """
    cost = row_cost(model, inputs)
    strategies, formats = _candidates(model, inputs, strategy, channels_last, differentiable)
    d = cost.input // inputs.element_size
    fitted = functools.partial(
        _fitted, cost=cost, d=d, classes=classes, budget=budget, class_chunk=class_chunk, rows=rows
    )
    if len(strategies) == 1 and len(formats) == 1:
        base = fitted(strategies[0], rows if rows is not None else min(total_rows, DEFAULT_JACOBIAN_ROWS))
        return JacobianPlan(base.strategy, base.rows, base.class_chunk, formats[0])
    key = (
        "jacobian",
        inputs.device,
        inputs.dtype,
        inputs.shape,
        classes,
        tuple(strategies),
        tuple(formats),
        differentiable,
        rows,
        work,
    )
    plan = _cached(model, key, JacobianPlan)
    if plan is None:
        plan, complete = _measure_jacobian(
            model,
            key,
            inputs,
            strategies,
            formats,
            fitted,
            run,
            rows,
            total_rows,
            classes - 1 if passes is None else passes,
            min(classes - 1, _CALIBRATION_CLASSES),
        )
        if complete:
            _remember(model, key, plan)
    assert isinstance(plan, JacobianPlan)
    base = fitted(plan.strategy, plan.rows)
    return JacobianPlan(base.strategy, base.rows, base.class_chunk, plan.channels_last)


def _candidates(
    model: nn.Module, inputs: Inputs, strategy: str, channels_last: bool | None, differentiable: bool
) -> tuple[list[Strategy], list[bool]]:
    """The strategies and memory formats a plan is chosen from, the default first."""
    if differentiable or not can_use_channels_last(model, inputs):
        channels_last = False
    formats = [False, True] if channels_last is None else [channels_last]
    if strategy != "auto":
        return [Strategy(strategy)], formats
    # The default (timed first, kept where there is no time to time more) by device: a CPU runs
    # one backward pass per class fastest on convolutional nets, a GPU the vmapped ones. Loop and
    # vmap pull the same cotangents: timing them changes speed and rounding only.
    pair = [Strategy.LOOP, Strategy.VMAP]
    return (pair[::-1] if inputs.device.type == "cuda" else pair), formats


def _fitted(
    name: Strategy,
    rows_wanted: int,
    *,
    cost: RowCost,
    d: int,
    classes: int,
    budget: int,
    class_chunk: int | None,
    rows: int | None,
) -> JacobianPlan:
    """The plan of strategy ``name`` for ``rows_wanted`` rows per pass (``d`` input coordinates,
    ``classes`` logits), cut to what ``budget`` holds (its class chunk chosen from the budget where
    none is given); the user's ``rows`` must fit."""
    chunk = class_chunk
    if name.traced and chunk is None:
        width = d if name.whole_jacobian else classes
        per_class = (3 * cost.largest + 2 * cost.input) * (2 if name.whole_jacobian else 1)
        fixed = rows_wanted * (cost.saved + 3 * classes * cost.input)
        chunk = max(1, min(width, (budget - fixed) // max(1, rows_wanted * per_class)))
        chunk = None if chunk >= width else int(chunk)
    per_row = jacobian_row_bytes(cost, name, classes, chunk)
    cap = rows_within(budget, per_row, what=f"one Jacobian pass ({name})")
    if rows is not None and rows > cap:
        raise too_many("batch_size", rows, cap, budget)
    return JacobianPlan(name, min(rows_wanted, cap), chunk, False)


def _measure_jacobian(
    model: nn.Module,
    key: tuple,
    inputs: Inputs,
    strategies: list[Strategy],
    formats: list[bool],
    fitted: Callable[[Strategy, int], JacobianPlan],
    run: Callable[[JacobianPlan, Tensor, int], object],
    rows: int | None,
    total_rows: int,
    passes: int,
    margins: int,
) -> tuple[JacobianPlan, bool]:
    """(plan, whether every candidate was timed): each (strategy, format) timed on a few rows and
    a class subset, the default first; the others only if timing them all fits the planning
    allowance (all or none: a plan measured in one call but not the next would change the float
    rounding between calls); then, on a GPU, the winner's rows doubled while that pays. On a CPU
    vmap must beat the loop by :data:`VMAP_PAYS` on the trial.

    Args:
        passes: backward passes per row the call will run (C - 1 margins, or fewer where
            pruned): with ``total_rows``, the size of the work the allowance is a share of.
        margins: the margins (or cotangents) each timed call runs.
    """
    allowance = _Allowance()
    trial_rows = rows if rows is not None else min(_TRIAL_ROWS, total_rows)
    candidates = [(strategy, channels_last) for strategy in strategies for channels_last in formats]
    default_rows = rows if rows is not None else min(total_rows, DEFAULT_JACOBIAN_ROWS)

    planned = functools.partial(_planned, fitted)
    default = planned(*candidates[0], default_rows)
    # Each timing costs about (warm-up + timed calls) x trial rows x (1 + margins) passes: a call
    # smaller than ten times all of them cannot repay the measuring, so it times nothing.
    trial_passes = (1 + _TIMED_CALLS) * trial_rows * (1 + margins)
    if total_rows * (1 + passes) < 10 * len(candidates) * trial_passes:
        return default, False

    def timed(plan: JacobianPlan) -> float:
        batch = inputs.rows(plan.rows)
        return tuning._seconds(lambda: run(plan, batch, margins), inputs.device)

    per_row = functools.partial(_per_row, passes=passes, margins=margins)
    failures: list[Exception] = []
    best: tuple[float, JacobianPlan] | None = None
    seconds = 0.0
    for index, (strategy, channels_last) in enumerate(candidates):
        plan = planned(strategy, channels_last, trial_rows)
        try:
            if best is None:  # the default: its first timing is remembered for later calls
                memo = (*key, trial_rows, strategy, channels_last)
                seconds = _first_timing(model, memo, functools.partial(_paired, timed, plan))[0]
                allowance.estimate = per_row(plan, seconds) * total_rows
                others = candidates[index + 1 :]
                # the first torch.func call imports its compiler stack: paid once per process
                startup = tuning.torch_func_startup() if any(s.traced for s, _ in others) else 0.0
                if not allowance.affords(len(others) * (1 + _TIMED_CALLS) * seconds + startup):
                    return planned(strategy, channels_last, default_rows), False
            else:
                seconds = timed(plan)
        except RuntimeError as exc:  # NotImplementedError included
            # A strategy torch.func cannot run through this model is no candidate; any other
            # error is the model's or probust's and propagates.
            if not cannot_trace(exc):
                raise
            failures.append(exc)
            continue
        cost = per_row(plan, seconds)
        if plan.strategy is Strategy.VMAP and inputs.device.type != "cuda":
            cost /= VMAP_PAYS  # the trial flatters vmap on a CPU (see the docstring)
        if best is None or cost < best[0]:
            best = (cost, plan)
    if best is None:
        raise failures[0]
    plan = best[1]
    if rows is not None:
        return plan, True
    plan = planned(plan.strategy, plan.channels_last, default_rows)
    if inputs.device.type != "cuda":
        return plan, True  # on a CPU a few dozen rows per pass are as fast as more
    return _grown(plan, planned, timed, per_row, allowance), True


def _planned(
    fitted: Callable[[Strategy, int], JacobianPlan], strategy: Strategy, channels_last: bool, rows_wanted: int
) -> JacobianPlan:
    """The plan of ``strategy`` in that memory format for ``rows_wanted`` rows, as the budget fits it."""
    base = fitted(strategy, rows_wanted)
    return JacobianPlan(strategy, base.rows, base.class_chunk, channels_last)


def _per_row(plan: JacobianPlan, seconds: float, *, passes: int, margins: int) -> float:
    """Seconds per row of the call's work from a timing on ``margins`` margins: loop and vmap
    were timed on a few of the margins (cost linear in them); forward mode computes the whole
    Jacobian whatever the subset."""
    scale = 1.0 if plan.strategy.whole_jacobian else max(passes, 1) / margins
    return seconds * scale / plan.rows


def _grown(
    plan: JacobianPlan,
    planned: Callable[[Strategy, bool, int], JacobianPlan],
    timed: Callable[[JacobianPlan], float],
    per_row: Callable[[JacobianPlan, float], float],
    allowance: _Allowance,
) -> JacobianPlan:
    """``plan`` with its rows doubled while each doubling lowers the cost per row by 5% and its
    timing fits the allowance (a GPU's plan). The plan is kept whether or not the rows grow (they
    may change float rounding, but a kept plan gives later calls the same rows)."""
    seconds = timed(plan)
    cost = per_row(plan, seconds)
    while plan.rows < _MAX_JACOBIAN_ROWS:
        bigger = planned(plan.strategy, plan.channels_last, plan.rows * 2)
        if bigger.rows <= plan.rows or not allowance.affords((1 + _TIMED_CALLS) * 2 * seconds):
            break
        seconds = timed(bigger)
        new_cost = per_row(bigger, seconds)
        if new_cost > 0.95 * cost:
            break
        cost, plan = new_cost, bigger
    return plan
