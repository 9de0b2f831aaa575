"""How an estimator's work runs: one object, given to the estimator, that owns the execution.

    ex = probust.Execution(batch_size=256, memory_budget="2GB")
    taylor = probust.Taylor(model, 0.1, execution=ex)
    mc = probust.MonteCarlo(model, 0.1, execution=ex)   # the same settings, the same plans

An :class:`Execution` holds the settings that do not depend on the device or the model: rows
per pass, the memory budget, the memory format, the Jacobian strategy, the classes per vmapped
pass and the progress bar. An estimator's own arguments say what it computes; its
``execution=`` says how that runs. It turns them into plans for a given model and batch: rows per forward pass of
noisy copies (:meth:`Execution.forward_plan`), how to differentiate (:meth:`Execution.jacobian_plan`),
points linearised together (:meth:`Execution.points_per_chunk`). Plans are declared by rules
from the model's row cost and the budget (:mod:`probust.execution.plans`), never timed: the
first call runs the plan of every later one, and estimators that share a model share its plans.

The estimators keep the maths (linearise, map to a probability, the error); everything here
changes speed and memory only, except the memory format and the Jacobian strategy, which
change float rounding (every plan computes the same quantity).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from probust._checks import check_choice, check_positive_int
from probust.errors import OptionError
from probust.execution.budget import RowCost, check_budget, resolve_budget, row_cost, rows_within
from probust.execution.plans import (
    DEFAULT_JACOBIAN_ROWS,
    JACOBIANS,
    ForwardPlan,
    jacobian_row_bytes,
    plan_forward,
    plan_jacobian,
    too_many,
)
from probust.linearisation import DeclaredCosts, JacobianPlan, Strategy, declared, forward_mode_runs, jvp_in_pulls

#: Rows per clean forward pass when ``batch_size`` is not given: a handful of passes, far from
#: any memory limit.
CLEAN_ROWS = 256
#: Points linearised together at most: the mvn-cdf is batched, more points per call gain nothing.
MAX_POINTS_PER_CHUNK = 1024
#: Rows per forward-mode pass where the reverse-mode plan runs fewer (budget permitting), by device
#: kind: forward mode keeps no graph, so it fits more rows than a backward pass. On a CPU a pass
#: of one row pays a pass's fixed work for that row alone, and more than a few rows per pass gain
#: nothing (docs/performance.md, "Forward mode"). On a GPU each pass pays torch.func's Python work
#: per layer, more than its kernels' time, so the sketch's probes of every row go in as few passes
#: as the budget holds.
FORWARD_MODE_ROWS: dict[str, int] = {"cpu": 8, "cuda": 512}


@dataclasses.dataclass(frozen=True)
class Inputs:
    """A batch ``x`` [B, *S] as the planners below the door see it: its description (S, dtype,
    device) and its first row, which the row cost runs (:func:`probust.execution.budget.row_cost`).

    The door (:class:`Execution`) makes one from ``x`` (:meth:`of`); the row cost is keyed by the
    description and the plans are declared from it (:mod:`~probust.execution.plans`).
    """

    shape: tuple[int, ...]
    dtype: torch.dtype
    device: torch.device
    first: Tensor = dataclasses.field(repr=False, compare=False)

    @classmethod
    def of(cls, x: Tensor) -> Inputs:
        """``x`` [B, *S] described, with its first row [1, *S] (detached, contiguous)."""
        return cls(tuple(x.shape[1:]), x.dtype, x.device, x[:1].detach().contiguous())

    @property
    def ndim(self) -> int:
        """Dimensions of the batch, rows included: ``1 + len(shape)``."""
        return 1 + len(self.shape)

    @property
    def element_size(self) -> int:
        """Bytes per input coordinate."""
        return self.dtype.itemsize


@dataclasses.dataclass(frozen=True)
class Execution:
    """The execution settings of an estimator, and the plans they give for a model and a batch.

    Args:
        batch_size: the most rows (clean or noisy copies, or Jacobian rows) in one pass through
            the model. None (default): declared from the model's largest activation and cut to
            what ``memory_budget`` holds (:mod:`probust.execution.plans`).
        memory_budget: bytes (or a size such as ``"2GB"``) the work may hold at once; None: half
            the memory free on the device at each call. Work that cannot fit raises an error
            naming this argument.
        channels_last: run convolutional models with weights and inputs in channels_last memory
            format (True), or not (False); None: forward passes in channels_last where every
            convolution's output stays at least 7 wide, Jacobian passes in the model's own
            format (:mod:`probust.execution.plans`). The model's
            weights are given back in their own format after each call.
        jacobian: how the backward passes run, one of :data:`~probust.execution.plans.JACOBIANS`:
            "loop" (one backward pass per class), "vmap" (torch.func, vectorised over classes);
            "auto" (default): the loop on a CPU, vmap on a GPU. Speed and rounding only: where the gradients come from
            (forward mode among them) is the estimators' ``gradients``.
        class_chunk_size: classes per vmapped backward pass (bounds memory for large C); None:
            chosen from the budget.
        show_progress: draw a progress bar over an estimator's work.

    Raises:
        ValueError: an argument out of range; the message names it.
    """

    batch_size: int | None = None
    memory_budget: int | str | None = None
    channels_last: bool | None = None
    jacobian: str = "auto"
    class_chunk_size: int | None = None
    show_progress: bool = False

    def __post_init__(self) -> None:
        if self.batch_size is not None:
            check_positive_int(self.batch_size, "batch_size")
        check_budget(self.memory_budget)
        if self.channels_last is not None and not isinstance(self.channels_last, bool):
            raise OptionError(
                f"must be True, False or None (declared), got {self.channels_last!r}", field="channels_last"
            )
        check_choice(self.jacobian, JACOBIANS, "jacobian")
        if self.class_chunk_size is not None:
            check_positive_int(self.class_chunk_size, "class_chunk_size")
        if not isinstance(self.show_progress, bool):
            raise OptionError(f"must be True or False, got {self.show_progress!r}", field="show_progress")

    def replace(self, **changes: Any) -> Execution:
        """A copy with some settings changed (validated again)."""
        return dataclasses.replace(self, **changes)

    def budget(self, x: Tensor) -> int:
        """The memory budget in bytes for work on ``x``'s device (the default: half its free memory, now)."""
        return resolve_budget(self.memory_budget, x.device)

    @staticmethod
    def classes(model: nn.Module, x: Tensor) -> int:
        """C, the logits per row of ``model`` on inputs like ``x``: read off its row cost (one
        forward pass on two rows, kept per model and input shape while the model's structure
        stays)."""
        return _row_cost(model, x).classes

    @staticmethod
    def declared_costs(device: torch.device) -> DeclaredCosts:
        """The declared costs the routes are chosen by on ``device``'s kind (never measured:
        :mod:`probust.linearisation.counting`)."""
        return declared(device)

    @property
    def clean_rows(self) -> int:
        """Rows per clean forward pass (no noise, no autograd)."""
        return self.batch_size or CLEAN_ROWS

    def forward_plan(self, model: Any, x: Tensor) -> ForwardPlan:
        """Rows per forward pass without autograd and the memory format for rows like ``x`` [B, *S]
        through ``model`` (in eval mode), declared (:func:`probust.execution.plans.plan_forward`).
        A plain callable (not an ``nn.Module``) gets :attr:`clean_rows` rows per pass in its own
        format.

        Raises:
            MemoryBudgetError: ``batch_size`` rows do not fit the budget, or not one row does.
        """
        if not isinstance(model, nn.Module):
            return ForwardPlan(self.clean_rows, False)
        return plan_forward(
            model, Inputs.of(x), budget=self.budget(x), rows=self.batch_size, channels_last=self.channels_last
        )

    def drawn_plan(self, x: Tensor, per_row: int, most: int) -> ForwardPlan:
        """Rows per pass of work that runs no model (logits drawn in their own space:
        :mod:`probust.estimators.affine`): ``most`` rows, or :attr:`batch_size` where given,
        within the memory budget at ``per_row`` bytes a row, beside one input row like ``x``'s
        (the clean pass's least). Nothing is measured.

        Raises:
            MemoryBudgetError: not one row fits, or ``batch_size`` rows do not.
        """
        budget = self.budget(x)
        fits = rows_within(budget, per_row, x[0].numel() * x.element_size(), what="a pass of noisy copies")
        if self.batch_size is None:
            return ForwardPlan(min(most, fits), False)
        if self.batch_size > fits:
            raise too_many("batch_size", self.batch_size, fits, budget)
        return ForwardPlan(self.batch_size, False)

    def jacobian_plan(
        self,
        model: nn.Module,
        x: Tensor,
        total_rows: int,
        *,
        differentiable: bool = False,
        forward: bool = False,
        offer_forward: bool = True,
    ) -> JacobianPlan:
        """How to differentiate ``total_rows`` rows like ``x`` within half the memory budget,
        declared (:func:`probust.execution.plans.plan_jacobian`).

        With ``jacobian="auto"``, forward mode is taken by counts, never timed: where one probe
        per input coordinate at its declared cost (:mod:`probust.linearisation.counting`) is cheaper
        than C - 1 backward passes and forward mode runs through the model (one untimed probe).

        Args:
            model: in eval mode.
            x: the batch [B, *S].
            total_rows: rows the call will differentiate.
            differentiable: the Jacobian must keep its graph (no forward mode, no channels_last).
            forward: forward mode, asked for by the estimator (its ``gradients="forward"``).
            offer_forward: whether ``jacobian="auto"`` may take forward mode by counts.
        """
        inputs = Inputs.of(x)
        classes = row_cost(model, inputs).classes
        strategy = self.jacobian
        if forward or (
            strategy == "auto" and not differentiable and offer_forward and _forward_mode_pays(model, x, classes)
        ):
            strategy = Strategy.FORWARD.value
        return plan_jacobian(
            model,
            inputs,
            classes,
            budget=self.budget(x) // 2,
            total_rows=total_rows,
            strategy=strategy,
            rows=self.batch_size,
            class_chunk=self.class_chunk_size,
            channels_last=self.channels_last,
            differentiable=differentiable,
        )

    def forward_mode_rows(self, model: nn.Module, x: Tensor, plan: JacobianPlan) -> int:
        """Rows per forward-mode (jvp) pass: the user's ``batch_size``; else the reverse-mode
        plan's rows, raised to :data:`FORWARD_MODE_ROWS` of the device where the budget holds them (a jvp holds
        the activations and their tangents, no graph: twice a forward pass without autograd)."""
        if self.batch_size is not None:
            return self.batch_size
        fits = rows_within(self.budget(x), 2 * _row_cost(model, x).inference, what="a forward-mode pass")
        most = FORWARD_MODE_ROWS.get(x.device.type, FORWARD_MODE_ROWS["cpu"])
        return max(plan.rows, min(most, fits))

    def pull_rows(self, model: nn.Module, x: Tensor, plan: JacobianPlan, copies: int = 1) -> int:
        """Rows per pass of reverse-mode pullbacks (the routes' screenings and exact gradients):
        the user's ``batch_size``; else the rows of as many points of ``copies`` rows each (MMSE's
        noisy copies) as the plan has rows, :data:`DEFAULT_JACOBIAN_ROWS` points for a
        forward-mode plan (whose rows are sized for a tangent per input coordinate), as far as a
        reverse-mode pass holds them within the budget (at least the plan's rows). The points of
        a pass share its screening and its pull width, so the default bounds points, not rows:
        32 rows would hold 6 points of MMSE's 5 copies, and 16 points would be screened in 3 groups."""
        if self.batch_size is not None:
            return plan.rows
        points = DEFAULT_JACOBIAN_ROWS if plan.strategy.whole_jacobian else plan.rows
        if points * copies <= plan.rows:
            return plan.rows
        cost = _row_cost(model, x)
        per_row = jacobian_row_bytes(cost, Strategy.LOOP, cost.classes, None)
        fits = rows_within(self.budget(x) // 2, per_row, what="a pass of pullbacks")
        return max(plan.rows, min(points * copies, fits))

    def graph_rows(self, model: nn.Module, x: Tensor, plan: JacobianPlan) -> int:
        """Rows whose forward graph a pass of pullbacks may keep for all its pulls: the user's
        ``batch_size``; else the rows whose activations and one backward pass through them fit half
        the budget (at least the plan's rows). Pulls of a few cotangents need no more."""
        if self.batch_size is not None:
            return self.batch_size
        fits = rows_within(self.budget(x) // 2, _row_cost(model, x).backward, what="a pass of pullbacks")
        return max(plan.rows, fits)

    def points_per_chunk(self, model: nn.Module, x: Tensor, copies: int = 1) -> int:
        """Points linearised together: their margin gradients (about four [C, *S] copies: the
        gradients and a float64 copy for the covariance), their ``copies`` noisy inputs each and
        the [C, C] covariance take at most half the memory budget; at most
        :data:`MAX_POINTS_PER_CHUNK`.

        Raises:
            MemoryBudgetError: not even one point fits; the message names ``memory_budget``.
        """
        cost = _row_cost(model, x)
        per_point = 4 * cost.classes * cost.input + 2 * copies * cost.input + 24 * cost.classes**2
        fits = rows_within(self.budget(x) // 2, per_point, what="the margin gradients of one point")
        return min(MAX_POINTS_PER_CHUNK, fits)


def _row_cost(model: nn.Module, x: Tensor) -> RowCost:
    """The row cost of ``model`` on rows like ``x`` [B, *S] (measured on its first row, once)."""
    return row_cost(model, Inputs.of(x))


def _forward_mode_pays(model: nn.Module, x: Tensor, classes: int) -> bool:
    """Whether every margin's gradient is cheaper by forward mode (one probe per input coordinate
    at its declared cost, :mod:`probust.linearisation.counting`) than by C - 1 backward passes, and
    forward mode runs through the model: counts and one untimed probe, no clock."""
    return x[0].numel() * jvp_in_pulls(x.device) < classes - 1 and forward_mode_runs(model, x)


#: The names of an :class:`Execution`'s settings: how the work runs, never an estimator's keywords.
EXECUTION_SETTINGS = frozenset(f.name for f in dataclasses.fields(Execution))

__all__ = ["CLEAN_ROWS", "EXECUTION_SETTINGS", "MAX_POINTS_PER_CHUNK", "Execution", "Inputs"]
