"""How to run a model within a memory budget: rows per pass, memory format and the Jacobian
strategy, declared by rules from the model and the budget, never timed.

The first call on a model runs at the speed of the second: nothing is measured before the work
but the row cost (one forward pass on two rows, :func:`probust.execution.budget.row_cost`), and a
plan is a function of the model's structure, the input description, the device and the budget
alone, so every call on the same model gives the same plan and the same bits. The rules, and
the sweeps they were chosen from, are in docs/performance.md ("Declared plans"):

- a forward pass without autograd takes the power of two of rows whose largest activation is
  nearest below :data:`FORWARD_PASS_BYTES` (between :data:`MIN_FORWARD_ROWS` and
  :data:`MAX_FORWARD_ROWS`): enough rows to amortise a pass's fixed work, few enough for its
  activations to stay in cache;
- convolutional nets run their forward passes in channels_last where every convolution's output
  is at least :data:`CHANNELS_LAST_MAP` wide and high (the paper's CNN at 28 x 28, a ResNet at
  224 x 224); a ResNet at 32 x 32 or 64 x 64, whose last maps are 4 x 4 or 2 x 2, runs as fast or
  faster in the default format (``channels_last=True`` / ``False`` decides);
- the Jacobian runs one backward pass per class on a CPU ("loop") and torch.func's vmap on a
  GPU, :data:`DEFAULT_JACOBIAN_ROWS` rows per pass, in the default memory format unless
  ``channels_last=True``; vmap's class chunks are chosen from the budget.

Plans agree to float rounding (each computes the same quantity).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn

from probust.errors import Setting
from probust.execution.budget import MemoryBudgetError, RowCost, human_bytes, row_cost, rows_within
from probust.linearisation import STRATEGIES, JacobianPlan, Strategy

if TYPE_CHECKING:  # the door's description of a batch; the door imports this module
    from probust.execution.engine import Inputs

#: The ``jacobian`` setting, how the backward passes run: "loop" (one backward pass per class),
#: "vmap" (torch.func, vectorised in class chunks) or "auto" (the device's declared default).
#: Forward mode is a source of the gradients (``gradients="forward"``), not a way to run
#: backward passes.
JACOBIANS = ("auto", *(s for s in STRATEGIES if not Strategy(s).whole_jacobian))
#: Bytes of the largest activation of one forward pass the declared rows aim at.
FORWARD_PASS_BYTES = 16 * 2**20
MIN_FORWARD_ROWS = 8
MAX_FORWARD_ROWS = 4096
#: channels_last for forward passes where no 2-D convolution's output is smaller than this.
CHANNELS_LAST_MAP = 7
#: Rows per Jacobian pass: on a CPU a few dozen rows per pass are as fast as more.
DEFAULT_JACOBIAN_ROWS = 32

__all__ = [
    "CHANNELS_LAST_MAP",
    "DEFAULT_JACOBIAN_ROWS",
    "FORWARD_PASS_BYTES",
    "JACOBIANS",
    "ForwardPlan",
    "can_use_channels_last",
    "jacobian_row_bytes",
    "plan_forward",
    "plan_jacobian",
    "sync",
    "too_many",
]


@dataclass(frozen=True)
class ForwardPlan:
    """Rows per forward pass without autograd, and whether to run in channels_last."""

    rows: int
    channels_last: bool


def can_use_channels_last(model: nn.Module, inputs: Inputs) -> bool:
    """channels_last applies to 4-D inputs of models with 4-D (convolution) weights."""
    return inputs.ndim == 4 and isinstance(model, nn.Module) and any(p.ndim == 4 for p in model.parameters())


def sync(device: torch.device) -> None:
    """Wait for the device's queued work (CUDA runs asynchronously), so a clock reads true."""
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def declared_forward_rows(cost: RowCost) -> int:
    """The power of two of rows whose largest activation is nearest below
    :data:`FORWARD_PASS_BYTES`, within [:data:`MIN_FORWARD_ROWS`, :data:`MAX_FORWARD_ROWS`]."""
    rows = MIN_FORWARD_ROWS
    while rows * 2 <= MAX_FORWARD_ROWS and rows * 2 * cost.largest <= FORWARD_PASS_BYTES:
        rows *= 2
    return rows


def plan_forward(
    model: nn.Module,
    inputs: Inputs,
    *,
    budget: int,
    rows: int | None = None,
    channels_last: bool | None = None,
) -> ForwardPlan:
    """Rows per pass and memory format for forward passes of ``model`` on rows like ``inputs``.

    Args:
        model: in eval mode; maps [B, *S] to logits.
        inputs: the batch as the door describes it.
        budget: bytes the passes may hold (inputs, noise, activations).
        rows: the user's rows per pass (then only checked against the budget); None: declared
            (:func:`declared_forward_rows`), cut to what the budget holds.
        channels_last: the user's choice of format; None: channels_last for a convolutional net
            whose feature maps stay at least :data:`CHANNELS_LAST_MAP` wide.

    Raises:
        MemoryBudgetError: ``rows`` rows do not fit ``budget``, or not one row does.
    """
    cost = row_cost(model, inputs)
    cap = rows_within(budget, cost.inference, what="one forward pass")
    usable = can_use_channels_last(model, inputs)
    fmt = usable and (channels_last is True or (channels_last is None and cost.smallest_map >= CHANNELS_LAST_MAP))
    if rows is not None:
        if rows > cap:
            raise too_many("batch_size", rows, cap, budget)
        return ForwardPlan(rows, fmt)
    return ForwardPlan(min(declared_forward_rows(cost), cap), fmt)


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
) -> JacobianPlan:
    """How to get the [C, *S] input Jacobian of ``total_rows`` rows within ``budget``.

    Args:
        model: in eval mode.
        inputs: the batch as the door describes it.
        classes: C, the number of logits.
        budget: bytes the passes may hold.
        total_rows: rows the caller will differentiate (a pass takes no more).
        strategy: "auto" ("loop" on a CPU, "vmap" on a GPU), or a
            :class:`~probust.linearisation.Strategy` used as given (forward mode:
            :meth:`probust.execution.Execution.jacobian_plan`).
        rows: the user's rows per pass (checked against the budget); None:
            :data:`DEFAULT_JACOBIAN_ROWS`, cut to what the budget holds.
        class_chunk: classes per vmapped pass (vmap); None chooses from the budget.
        channels_last: True runs a convolutional net's passes in channels_last; False or None
            (default) in its own format. Off when ``differentiable``.
        differentiable: the Jacobian must keep its graph.

    Raises:
        MemoryBudgetError: ``rows`` rows do not fit ``budget``, or not one row does.
    """
    cost = row_cost(model, inputs)
    if strategy == "auto":
        strategy = Strategy.VMAP.value if inputs.device.type == "cuda" else Strategy.LOOP.value
    name = Strategy(strategy)
    wanted = rows if rows is not None else max(1, min(total_rows, DEFAULT_JACOBIAN_ROWS))
    d = cost.input // inputs.element_size
    chunk = class_chunk
    if name.traced and chunk is None:
        width = d if name.whole_jacobian else classes
        per_class = (3 * cost.largest + 2 * cost.input) * (2 if name.whole_jacobian else 1)
        fixed = wanted * (cost.saved + 3 * classes * cost.input)
        chunk = max(1, min(width, (budget - fixed) // max(1, wanted * per_class)))
        chunk = None if chunk >= width else int(chunk)
    cap = rows_within(budget, jacobian_row_bytes(cost, name, classes, chunk), what=f"one Jacobian pass ({name})")
    if rows is not None and rows > cap:
        raise too_many("batch_size", rows, cap, budget)
    fmt = channels_last is True and not differentiable and can_use_channels_last(model, inputs)
    return JacobianPlan(name, min(wanted, cap), chunk, fmt)


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
