"""What probust's torchmetrics metrics share: each point's index, hence its random streams.

Every probust estimator draws a point's noise from ``(seed, index of the point)``. A metric sees
its points batch by batch, so it keeps a running count of the points it has measured since the
last :meth:`~torchmetrics.Metric.reset`: the k-th point measured gets index ``k`` (the batches'
``index_offset``). One process's numbers are then those of one probust call on all its points
concatenated (``probust.estimate(model, torch.cat(batches), ..., index_offset=0)``), however they
were batched.

Under DDP every rank sees different points, and they must not share streams: rank ``r`` numbers its
points from ``r * RANK_STRIDE`` (2**40 points per rank before two ranks could meet). The numbers
of a multi-process run therefore differ from a one-process run over the same points (other
noise, the same distribution), but they do not depend on batch size, and a rank's numbers do
not depend on the other ranks.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

from probust._extras import missing_extra
from probust.errors import OptionError

try:
    from torchmetrics import Metric
except ModuleNotFoundError as exc:  # torchmetrics missing: name the extra that installs it
    raise (missing_extra(exc, "probust.metrics") or exc) from exc

#: The index of rank r's first point is ``r * RANK_STRIDE``, so that ranks never share a stream.
RANK_STRIDE = 1 << 40


def process_rank() -> int:
    """This process's rank in the default ``torch.distributed`` group; 0 outside one."""
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return torch.distributed.get_rank()
    return 0


def usable_inputs(x: Tensor) -> Tensor:
    """``x`` as an ordinary tensor that autograd may use.

    Lightning validates under ``torch.inference_mode()``; a tensor created there cannot enter
    autograd (the analytic estimators differentiate the margins), so it is copied out of it.
    Call within ``torch.inference_mode(False)``.
    """
    return x.clone() if x.is_inference() else x


class PointwiseMetric(Metric):
    """A torchmetrics :class:`~torchmetrics.Metric` over points measured one by one, with their
    per-point random streams (see the module's docstring).

    Args:
        max_points: measure at most this many points per process between resets (the rows past
            it in an ``update`` are ignored); None: every point.
        **kwargs: passed to :class:`torchmetrics.Metric` (``process_group``, ``sync_on_compute``, ...).

    Attributes:
        points_seen: the points this process has measured since the last reset.
    """

    # The states are per-point lists or sums: torchmetrics may reduce them batch by batch.
    full_state_update = False
    is_differentiable = False

    def __init__(self, *, max_points: int | None = None, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        if max_points is not None and (
            isinstance(max_points, bool) or not isinstance(max_points, int) or max_points < 1
        ):
            raise OptionError(f"must be None or an integer >= 1, got {max_points!r}", field="max_points")
        self.max_points = max_points
        self.points_seen = 0
        self._in_forward = False

    @property
    def full(self) -> bool:
        """True when ``max_points`` points have been measured: further updates do nothing."""
        return self.max_points is not None and self.points_seen >= self.max_points

    def _take(self, x: Tensor) -> tuple[int, int]:
        """How many rows of ``x`` to measure (``max_points``) and the index of the first.

        Advances :attr:`points_seen` by that many rows.
        """
        rows = x.shape[0] if self.max_points is None else max(0, min(x.shape[0], self.max_points - self.points_seen))
        first = process_rank() * RANK_STRIDE + self.points_seen
        self.points_seen += rows
        return rows, first

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        """Update with the batch and return its own values (torchmetrics' ``forward``); the
        batch's points take the next indices, as with :meth:`update`."""
        # torchmetrics' forward resets the metric to compute the batch alone: the point count
        # must survive that reset, or every batch would reuse the first indices.
        self._in_forward = True
        try:
            return super().forward(*args, **kwargs)
        finally:
            self._in_forward = False

    def reset(self) -> None:
        """Forget every point: the next one measured takes index 0 again (rank 0), so an epoch's
        points keep their noise from one reset to the next."""
        super().reset()
        if not self._in_forward:
            self.points_seen = 0
