"""How to run a model fast within a memory budget: rows per pass and memory format (the Jacobian
strategy: :mod:`probust.execution.jacobian_plans`), and the timing both are measured by.

The fastest plan depends on the model, the device and the batch (``channels_last`` for a
convolutional net, a few dozen rows per pass rather than thousands, one backward pass per class
or torch.func's vmap), so the first call on a model times a few passes on copies of its real
inputs and keeps the fastest plan per (model structure, device, input shape, dtype, classes), in
memory and on disk (:mod:`probust.execution.plan_cache`): later calls and runs compute with the
same plan and give the same bits. Plans agree to float rounding (each computes the same quantity).

Measuring is bounded by the call it serves: the default plan's first timing estimates the call,
and the other candidates are timed, cheapest first, while the measuring stays within
:data:`PLANNING_SHARE` of that estimate. A plan is kept only once every candidate was timed; a
call too small to time even the default gets the default without measuring.
"""

from __future__ import annotations

import functools
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import torch
from torch import Tensor, nn

from probust._user_model import PerModel, to_format, weights_in_format
from probust.errors import Setting
from probust.execution import plan_cache
from probust.execution.budget import MemoryBudgetError, human_bytes, row_cost, rows_within
from probust.linearisation import STRATEGIES, JacobianPlan, Strategy

if TYPE_CHECKING:  # the door's description of a batch; the door imports this module
    from probust.execution.engine import Inputs

#: The ``jacobian`` setting, how the backward passes run: "loop" (one backward pass per class),
#: "vmap" (torch.func, vectorised in class chunks) or "auto" (measured). Forward mode is a source
#: of the gradients (``gradients="forward"``), not a way to run backward passes.
JACOBIANS = ("auto", *(s for s in STRATEGIES if not Strategy(s).whole_jacobian))

#: Measuring a plan may cost at most this share of the (estimated) call it serves.
PLANNING_SHARE = 0.1
_MAX_FORWARD_ROWS = 4096
_FIRST_FORWARD_ROWS = 64  # the forward ladder's first (and default) rows per pass
_TIMED_CALLS = 2  # timed calls after the warm-up call; the fastest counts
#: What torch.func's first call in a process is counted to cost, in seconds (declared, not timed:
#: it imports torch._dynamo; docs/performance.md, "First use").
TORCH_FUNC_IMPORT_SECONDS = 2.0


def torch_func_startup() -> float:
    """Seconds the next torch.func call (the "vmap" and "forward" strategies, vmapped pulls) will
    spend on imports: 0 once torch._dynamo is loaded."""
    return 0.0 if "torch._dynamo" in sys.modules else TORCH_FUNC_IMPORT_SECONDS


@dataclass(frozen=True)
class ForwardPlan:
    """Rows per forward pass without autograd, and whether to run in channels_last."""

    rows: int
    channels_last: bool


def _cached(model: nn.Module, key: tuple, kind: type) -> ForwardPlan | JacobianPlan | None:
    return plan_cache.lookup(model, plan_cache.plan_key(model, key[1], key), kind)


def _remember(model: nn.Module, key: tuple, plan: ForwardPlan | JacobianPlan) -> None:
    plan_cache.store(model, plan_cache.plan_key(model, key[1], key), plan)


def forget(model: nn.Module) -> None:
    """Drop the plans of ``model`` kept in memory (the next call looks on disk or measures)."""
    plan_cache.forget(model)


def can_use_channels_last(model: nn.Module, inputs: Inputs) -> bool:
    """channels_last applies to 4-D inputs of models with 4-D (convolution) weights."""
    return inputs.ndim == 4 and isinstance(model, nn.Module) and any(p.ndim == 4 for p in model.parameters())


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a clock reads true."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(run: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call: after one warm-up call (first calls build kernels and caches),
    the fastest of :data:`_TIMED_CALLS` timed calls. Other work on the machine only ever slows a
    call down, so the minimum is the estimate least disturbed by it."""
    run()
    sync(device)
    best = float("inf")
    for _ in range(_TIMED_CALLS):
        start = time.perf_counter()
        run()
        sync(device)
        best = min(best, time.perf_counter() - start)
    return best


class _Allowance:
    """The planning budget of one call: :data:`PLANNING_SHARE` of the call's estimated seconds
    (``estimate``, set from the first timing); ``affords(seconds)``: whether one more timing of
    that cost stays within it, counting the wall time spent since the allowance was opened."""

    def __init__(self) -> None:
        self.start = time.perf_counter()
        self.estimate = float("inf")

    def spent(self) -> float:
        return time.perf_counter() - self.start

    def affords(self, seconds: float) -> bool:
        return self.spent() + seconds <= PLANNING_SHARE * self.estimate


#: The default plan's first timing per model and plan key, in this process: (seconds per unit of
#: work, seconds of one timed call). A later call sizes its allowance from it without timing again.
_FIRST_TIMINGS: PerModel[tuple[float, float]] = PerModel()


def _first_timing(model: Any, key: tuple, measure: Callable[[], tuple[float, float]]) -> tuple[float, float]:
    """The default plan's (seconds per unit, seconds per timed call): remembered, or ``measure()``."""
    known = _FIRST_TIMINGS.get(model, key)
    if known is not None:
        return known
    timing = measure()
    _FIRST_TIMINGS.put(model, key, timing)
    return timing


def _paired(timed: Callable[[JacobianPlan], float], plan: JacobianPlan) -> tuple[float, float]:
    return timed(plan), 0.0


def plan_forward(
    model: nn.Module,
    inputs: Inputs,
    *,
    budget: int,
    total_rows: int,
    rows: int | None = None,
    channels_last: bool | None = None,
    step: Callable[[Tensor], object] | None = None,
) -> ForwardPlan:
    """Rows per pass and memory format for ``total_rows`` forward passes of ``model`` on rows like ``inputs``.

    Args:
        model: in eval mode; maps [B, *S] to logits.
        inputs: the batch as the door describes it (timings are taken on its rows).
        budget: bytes the passes may hold (inputs, noise, activations).
        total_rows: rows the caller will run; below a few passes' worth nothing is measured.
        rows: the user's rows per pass (then only checked against the budget).
        channels_last: the user's choice of format; None measures it.
        step: what one pass really does, timed instead of ``model(rows)`` (e.g. draw the
            noise, add it, run the model); it gets rows already in the memory format.
    """
    cost = row_cost(model, inputs)
    cap = rows_within(budget, cost.inference, what="one forward pass")
    usable = can_use_channels_last(model, inputs)
    if rows is not None:
        if rows > cap:
            raise too_many("batch_size", rows, cap, budget)
        return ForwardPlan(rows, bool(channels_last) and usable)
    formats = [False, True] if channels_last is None and usable else [bool(channels_last)]
    key = ("forward", inputs.device, inputs.dtype, inputs.shape, tuple(formats))
    plan = _cached(model, key, ForwardPlan)
    if plan is None:
        plan, complete = _measure_forward(
            model, inputs, formats, min(cap, _MAX_FORWARD_ROWS), step or model, total_rows, key
        )
        if complete:
            _remember(model, key, plan)
    assert isinstance(plan, ForwardPlan)
    return ForwardPlan(min(plan.rows, cap), plan.channels_last)


def _measure_forward(
    model: nn.Module,
    inputs: Inputs,
    formats: list[bool],
    cap: int,
    step: Callable[[Tensor], object],
    total_rows: int,
    key: tuple,
) -> tuple[ForwardPlan, bool]:
    """(plan, whether every format was timed): the default rows in each format, then the fastest
    format's rows doubled while throughput grows, as far as the planning allowance reaches.

    Throughput over batch size is bumpy (cache sizes, kernel choices), so the ladder goes on
    past a small dip; it ends at the cap, at a clear loss, or where the allowance runs out. The
    plan is complete once both formats are timed (the format, and the rows per pass, may change
    float rounding: a kept plan gives later calls the same ones)."""
    allowance = _Allowance()
    first = min(cap, _FIRST_FORWARD_ROWS)
    default = ForwardPlan(min(first, max(total_rows, 1)), formats[0])
    if total_rows < 10 * len(formats) * (1 + _TIMED_CALLS) * first:
        return default, False  # a tenth of the call cannot pay for timing every format

    def rate(plan: ForwardPlan) -> tuple[float, float]:
        with weights_in_format(model, plan.channels_last), torch.inference_mode():
            batch = to_format(inputs.rows(plan.rows), plan.channels_last)
            seconds = _seconds(functools.partial(step, batch), inputs.device)
        return plan.rows / max(seconds, 1e-9), seconds

    seconds_per_row, seconds = _first_timing(model, key, lambda: _inverse(rate(default)))
    best_rate = 1 / seconds_per_row
    allowance.estimate = total_rows * seconds_per_row
    # Every format or none: a format measured in one call but not the next would change the
    # float rounding between calls.
    if not allowance.affords((len(formats) - 1) * (1 + _TIMED_CALLS) * seconds):
        return default, False
    best = default
    for channels_last in formats[1:]:
        candidate = ForwardPlan(first, channels_last)
        got, seconds = rate(candidate)
        if got > best_rate:
            best_rate, best = got, candidate
    rows, losses = best.rows, 0
    while rows < cap:
        rows = min(cap, rows * 2)
        # One pass of twice the rows costs about twice the last timing.
        if not allowance.affords((1 + _TIMED_CALLS) * seconds * rows / max(rows // 2, 1)):
            break
        got, seconds = rate(ForwardPlan(rows, best.channels_last))
        if got > best_rate:
            best_rate, best, losses = got, ForwardPlan(rows, best.channels_last), 0
        elif got < 0.8 * best_rate or (losses := losses + 1) >= 2:
            break
    return best, True


def _inverse(timing: tuple[float, float]) -> tuple[float, float]:
    """(rows per second, seconds) -> (seconds per row, seconds)."""
    return 1 / max(timing[0], 1e-12), timing[1]


def too_many(name: str, rows: int, cap: int, budget: int) -> MemoryBudgetError:
    return MemoryBudgetError(
        Setting(name, rows),
        " rows per pass need more than ",
        Setting("memory_budget"),
        f" ({human_bytes(budget)}) allows: at most {cap} rows fit; lower ",
        Setting(name),
        " or raise ",
        Setting("memory_budget"),
    )


__all__ = [
    "JACOBIANS",
    "ForwardPlan",
    "JacobianPlan",
    "can_use_channels_last",
    "forget",
    "plan_forward",
    "to_format",
    "too_many",
    "weights_in_format",
]
