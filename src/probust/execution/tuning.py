"""How to run a model fast within a memory budget: rows per pass, memory format, Jacobian strategy.

The fastest way to push many rows through a network depends on the model, the device and
the batch: on a CPU a convolutional net may run twice as fast with its weights and inputs in
``channels_last`` format, a few dozen rows per pass are often faster than thousands, and for
input gradients one backward pass per class can beat torch.func's vmapped backward (or the
reverse, for small models and on GPUs). So the first call on a model measures: a few timed
passes on copies of the real inputs, and the fastest plan is kept per (model structure,
device, input shape, dtype, classes), in memory and on disk (:mod:`probust.execution.plan_cache`), so
that later calls and later runs compute with the same plan and give the same numbers to the
last bit. Different plans agree to float rounding: every strategy computes the same quantity,
and rows are independent in eval mode.

Work too small to repay the measurement gets a default plan without measuring.
"""

from __future__ import annotations

import contextlib
import functools
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from probust.execution import plan_cache
from probust.execution.budget import MemoryBudgetError, RowCost, human_bytes, row_cost, rows_within

#: Jacobian strategies: "loop" (one forward with autograd, one backward pass per class),
#: "vmap" (torch.func: all classes' backward passes vectorised, in class chunks), "forward"
#: (torch.func forward mode: one Jacobian-vector product per input coordinate; for inputs
#: with fewer coordinates than classes). "auto" measures.
JACOBIANS = ("auto", "loop", "vmap", "forward")

_MAX_FORWARD_ROWS = 4096
_MAX_JACOBIAN_ROWS = 256
_TRIAL_SECONDS = 0.25  # stop growing a batch once one timed pass takes this long
_CALIBRATION_CLASSES = 4  # class (or tangent) subset timed; cost is linear in it
_MIN_TIMING = 0.06  # seconds of repeated calls per timing, over _MIN_CALLS repetitions
_MIN_CALLS = 3


@dataclass(frozen=True)
class ForwardPlan:
    """Rows per forward pass without autograd, and whether to run in channels_last."""

    rows: int
    channels_last: bool


@dataclass(frozen=True)
class JacobianPlan:
    """How to compute input Jacobians: strategy, rows per pass, classes per vmapped pass."""

    strategy: str
    rows: int
    class_chunk: int | None
    channels_last: bool


def _cached(model: nn.Module, key: tuple, kind: type) -> ForwardPlan | JacobianPlan | None:
    return plan_cache.lookup(model, plan_cache.plan_key(model, key[1], key), kind)


def _remember(model: nn.Module, key: tuple, plan: ForwardPlan | JacobianPlan) -> None:
    plan_cache.store(model, plan_cache.plan_key(model, key[1], key), plan)


def forget(model: nn.Module) -> None:
    """Drop the plans of ``model`` kept in memory (the next call looks on disk or measures)."""
    plan_cache.forget(model)


def can_use_channels_last(model: nn.Module, x: Tensor) -> bool:
    """channels_last applies to 4-D inputs of models with 4-D (convolution) weights."""
    return x.ndim == 4 and isinstance(model, nn.Module) and any(p.ndim == 4 for p in model.parameters())


@contextlib.contextmanager
def weights_in_format(model: nn.Module, channels_last: bool) -> Iterator[None]:
    """Hold the model's 4-D parameters and buffers in channels_last, then give the originals back.

    The model's tensors are swapped (``.data``), not copied into: the caller's model, its
    optimiser state and its parameters' identities are untouched once the block exits.
    """
    if not channels_last:
        yield
        return
    swapped: list[tuple[Tensor, Tensor]] = []
    try:
        for tensor in [*model.parameters(), *model.buffers()]:
            if tensor.ndim == 4 and not tensor.is_contiguous(memory_format=torch.channels_last):
                swapped.append((tensor, tensor.data))
                tensor.data = tensor.data.contiguous(memory_format=torch.channels_last)
        yield
    finally:
        for tensor, original in swapped:
            tensor.data = original


def to_format(x: Tensor, channels_last: bool) -> Tensor:
    return x.contiguous(memory_format=torch.channels_last) if channels_last else x


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a clock reads true."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _seconds(run: Callable[[], object], device: torch.device) -> float:
    """Wall time of one call: after one warm-up call (first calls build kernels and caches),
    the fastest of at least ``_MIN_CALLS`` timings, each of as many calls as fill
    ``_MIN_TIMING``. Other work on the machine only ever slows a call down, so the minimum is
    the estimate least disturbed by it (a mean of one call of a millisecond is noise)."""
    run()
    sync(device)
    best = float("inf")
    for _ in range(_MIN_CALLS):
        calls, start = 0, time.perf_counter()
        while True:
            run()
            sync(device)
            calls += 1
            elapsed = time.perf_counter() - start
            if elapsed >= _MIN_TIMING / _MIN_CALLS:
                break
        best = min(best, elapsed / calls)
    return best


def _rows_like(x: Tensor, rows: int) -> Tensor:
    """``rows`` inputs cycled from ``x`` (realistic values, so timings match the real work)."""
    reps = -(-rows // x.shape[0])
    return x.detach().repeat(reps, *([1] * (x.ndim - 1)))[:rows].contiguous()


def plan_forward(
    model: nn.Module,
    x: Tensor,
    *,
    budget: int,
    total_rows: int,
    rows: int | None = None,
    channels_last: bool | None = None,
    step: Callable[[Tensor], object] | None = None,
) -> ForwardPlan:
    """Rows per pass and memory format for ``total_rows`` forward passes like ``model(x)``.

    Args:
        model: in eval mode; maps [B, *S] to logits.
        x: a few real inputs [b, *S] (timings are taken on copies of them).
        budget: bytes the passes may hold (inputs, noise, activations).
        total_rows: rows the caller will run; below a few passes' worth nothing is measured.
        rows: the user's rows per pass (then only checked against the budget).
        channels_last: the user's choice of format; None measures it.
        step: what one pass really does, timed instead of ``model(rows)`` (e.g. draw the
            noise, add it, run the model); it gets rows already in the memory format.
    """
    cost = row_cost(model, x)
    cap = rows_within(budget, cost.inference, what="one forward pass")
    if rows is not None:
        if rows > cap:
            raise _too_many("batch_size", rows, cap, budget)
        return ForwardPlan(rows, bool(channels_last) and can_use_channels_last(model, x))
    formats = [False, True] if channels_last is None and can_use_channels_last(model, x) else [bool(channels_last)]
    key = ("forward", x.device, x.dtype, tuple(x.shape[1:]), tuple(formats))
    plan = _cached(model, key, ForwardPlan)
    if plan is None and total_rows < 4 * 256:
        return ForwardPlan(min(total_rows, cap, 512), formats[0])
    if plan is None:
        plan = _measure_forward(model, x, formats, min(cap, _MAX_FORWARD_ROWS), step or model)
        _remember(model, key, plan)
    assert isinstance(plan, ForwardPlan)
    return ForwardPlan(min(plan.rows, cap), plan.channels_last)


def _measure_forward(
    model: nn.Module, x: Tensor, formats: list[bool], cap: int, step: Callable[[Tensor], object]
) -> ForwardPlan:
    """Time ``step`` over rows 32, 64, ... up to ``cap`` in each format; keep the fastest.

    Throughput over batch size is bumpy (cache sizes, kernel choices), so the whole ladder is
    timed; only the time limit of one pass ends it early."""
    best = (0.0, ForwardPlan(min(cap, 64), formats[0]))
    for channels_last in formats:
        with weights_in_format(model, channels_last), torch.inference_mode():
            rows = min(cap, 32)
            while True:
                batch = to_format(_rows_like(x, rows), channels_last)
                seconds = _seconds(functools.partial(step, batch), x.device)
                rate = rows / max(seconds, 1e-9)
                if rate > best[0]:
                    best = (rate, ForwardPlan(rows, channels_last))
                if seconds > _TRIAL_SECONDS or rows >= cap:
                    break
                rows = min(cap, rows * 2)
    return best[1]


def jacobian_row_bytes(cost: RowCost, strategy: str, classes: int, class_chunk: int | None) -> int:
    """Bytes per row of one Jacobian pass: the pass itself and the [C, *S] Jacobian it returns
    (about three copies of it live at once: per-class gradients, the stacked Jacobian and
    the margin gradients made from it)."""
    jacobian = 3 * classes * cost.input
    if strategy == "loop":
        return cost.backward + jacobian
    chunk = classes if class_chunk is None else class_chunk
    if strategy == "vmap":
        return cost.saved + chunk * (3 * cost.largest + 2 * cost.input) + jacobian
    return 2 * chunk * (3 * cost.largest + 2 * cost.input) + jacobian  # forward mode


def plan_jacobian(
    model: nn.Module,
    x: Tensor,
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
) -> JacobianPlan:
    """The fastest way to get the [C, *S] input Jacobian of ``total_rows`` rows within ``budget``.

    Args:
        model: in eval mode.
        x: a few real inputs [b, *S].
        classes: C, the number of logits.
        budget: bytes the passes may hold.
        total_rows: rows the caller will differentiate; tiny jobs get a default plan.
        strategy: one of :data:`JACOBIANS`; anything but "auto" is used as given.
        rows: the user's rows per pass (checked against the budget).
        class_chunk: classes per vmapped pass (vmap); None chooses from the budget.
        channels_last: the user's choice of format; None measures it (off when differentiable).
        differentiable: the Jacobian must keep its graph (forward mode is not offered).
        run: ``run(plan, rows, k)`` computes the gradients of k margins of ``rows`` for timing.
    """
    cost = row_cost(model, x)
    d = cost.input // x.element_size()
    if differentiable or not can_use_channels_last(model, x):
        channels_last = False
    if strategy == "auto":
        strategies = ["loop", "vmap"] + (["forward"] if d < classes and not differentiable else [])
    else:
        strategies = [strategy]
    formats = [False, True] if channels_last is None else [channels_last]

    def fitted(name: str, rows_wanted: int) -> JacobianPlan:
        chunk = class_chunk
        if name in ("vmap", "forward") and chunk is None:
            width = classes if name == "vmap" else d
            per_class = (3 * cost.largest + 2 * cost.input) * (2 if name == "forward" else 1)
            fixed = rows_wanted * (cost.saved + 3 * classes * cost.input)
            chunk = max(1, min(width, (budget - fixed) // max(1, rows_wanted * per_class)))
            chunk = None if chunk >= width else int(chunk)
        per_row = jacobian_row_bytes(cost, name, classes, chunk)
        cap = rows_within(budget, per_row, what=f"one Jacobian pass ({name})")
        if rows is not None and rows > cap:
            raise _too_many("batch_size", rows, cap, budget)
        return JacobianPlan(name, min(rows_wanted, cap), chunk, False)

    if len(strategies) == 1 and len(formats) == 1:
        base = fitted(strategies[0], rows if rows is not None else min(total_rows, 32))
        return JacobianPlan(base.strategy, base.rows, base.class_chunk, formats[0])
    key = (
        "jacobian",
        x.device,
        x.dtype,
        tuple(x.shape[1:]),
        classes,
        tuple(strategies),
        tuple(formats),
        differentiable,
        rows,
    )
    plan = _cached(model, key, JacobianPlan)
    if plan is None and total_rows * classes < 16 * 4 * 32:
        default = "vmap" if x.device.type == "cuda" or "loop" not in strategies else "loop"
        base = fitted(default, rows if rows is not None else min(total_rows, 32))
        return JacobianPlan(base.strategy, base.rows, base.class_chunk, formats[0])
    if plan is None:
        plan = _measure_jacobian(x, classes, strategies, formats, fitted, run, rows)
        _remember(model, key, plan)
    assert isinstance(plan, JacobianPlan)
    base = fitted(plan.strategy, plan.rows)
    return JacobianPlan(base.strategy, base.rows, base.class_chunk, plan.channels_last)


def _measure_jacobian(
    x: Tensor,
    classes: int,
    strategies: list[str],
    formats: list[bool],
    fitted: Callable[[str, int], JacobianPlan],
    run: Callable[[JacobianPlan, Tensor, int], object],
    rows: int | None,
) -> JacobianPlan:
    """Time each (strategy, format) on a class subset, then grow the winner's rows (unless
    the caller fixed ``rows``)."""
    margins = min(classes - 1, _CALIBRATION_CLASSES)

    def per_row(plan: JacobianPlan) -> tuple[float, float]:
        batch = _rows_like(x, plan.rows)
        seconds = _seconds(lambda: run(plan, batch, margins), x.device)
        # loop and vmap were timed on a few of the C - 1 margins (cost linear in them);
        # forward mode computes the whole Jacobian whatever the subset.
        scale = 1.0 if plan.strategy == "forward" else (classes - 1) / margins
        return seconds * scale / plan.rows, seconds

    best: tuple[float, JacobianPlan] | None = None
    failures: list[Exception] = []
    for strategy in strategies:
        for channels_last in formats:
            base = fitted(strategy, rows if rows is not None else 16)
            plan = JacobianPlan(strategy, base.rows, base.class_chunk, channels_last)
            try:
                cost, _ = per_row(plan)
            except (RuntimeError, NotImplementedError, AttributeError, TypeError) as exc:
                # A strategy this model cannot run (e.g. torch.func on TorchScript) is no candidate.
                failures.append(exc)
                continue
            if best is None or cost < best[0]:
                best = (cost, plan)
    if best is None:
        raise failures[0]
    cost, plan = best
    while rows is None and plan.rows < _MAX_JACOBIAN_ROWS:
        base = fitted(plan.strategy, plan.rows * 2)
        if base.rows <= plan.rows:
            break
        bigger = JacobianPlan(plan.strategy, base.rows, base.class_chunk, plan.channels_last)
        new_cost, seconds = per_row(bigger)
        if new_cost > 0.95 * cost:
            break
        cost, plan = new_cost, bigger
        if seconds > 2 * _TRIAL_SECONDS:
            break
    return plan


def _too_many(name: str, rows: int, cap: int, budget: int) -> MemoryBudgetError:
    return MemoryBudgetError(
        f"{name}={rows} rows per pass needs more than memory_budget={human_bytes(budget)} allows "
        f"(at most {cap} rows fit); lower {name} or raise memory_budget"
    )


__all__ = [
    "JACOBIANS",
    "ForwardPlan",
    "JacobianPlan",
    "can_use_channels_last",
    "forget",
    "jacobian_row_bytes",
    "plan_forward",
    "plan_jacobian",
    "to_format",
    "weights_in_format",
]
