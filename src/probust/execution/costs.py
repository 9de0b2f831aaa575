"""Whether the routes of Taylor and MMSE pull their cotangents with vmap: a speed choice only.

The routes (:mod:`probust.estimators.routes`) pull narrow batches of cotangents (8 probes, then a
few candidates: 9 run as 16, since vmap pads every pull to ``VMAP_STEP``). Where the Jacobian plan
takes vmap, they pull with it only where one cotangent's share of a vmapped step costs at most
:data:`~probust.execution.tuning.VMAP_PAYS` of a pull by its own backward pass. Both compute the
same gradients; which one runs changes speed and float rounding, never which gradients are taken
(that is decided by counts: :mod:`probust.execution.cost_model`).

Measured once per model, input shape and plan, and kept like plans (per model object in memory,
by structure on disk: :mod:`probust.execution.plan_cache`), so later calls and later runs on the
machine pull the same way.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass

import torch
from torch import Tensor, nn

from probust._memory_format import to_format
from probust.execution import plan_cache
from probust.execution.tuning import VMAP_PAYS, JacobianPlan, sync
from probust.gradients import VMAP_STEP, Pullback, Strategy


@dataclass(frozen=True)
class PullCosts:
    """Seconds per row of one cotangent's pullback, by strategy (measured on two rows).

    Attributes:
        vmapped: one cotangent's share of a vmapped step of :data:`VMAP_STEP` cotangents.
        loop: one cotangent by its own backward pass on a kept graph.
    """

    vmapped: float
    loop: float

    @property
    def vmap_pays(self) -> bool:
        """Whether the routes pull with vmap: it costs at most :data:`VMAP_PAYS` of the loop."""
        return self.vmapped <= VMAP_PAYS * self.loop


def pull_strategy(model: nn.Module, head: nn.Linear | None, x: Tensor, plan: JacobianPlan) -> Strategy:
    """How the routes pull on rows like ``x``: by loop unless the plan takes vmap and the measured
    :class:`PullCosts` show it pays (measured only then, once per model, shape and plan)."""
    if plan.strategy is not Strategy.VMAP:
        return Strategy.LOOP
    key = ("pull-costs", x.device, x.dtype, tuple(x.shape[1:]), plan.channels_last, head is None)
    cache_key = plan_cache.plan_key(model, x.device, key)
    costs = plan_cache.lookup(model, cache_key, PullCosts)
    if not isinstance(costs, PullCosts):
        rows = to_format(x[:1].expand(2, *x.shape[1:]).contiguous(), plan.channels_last)
        costs = PullCosts(
            vmapped=_pull_seconds(model, head, rows, Strategy.VMAP),
            loop=_pull_seconds(model, head, rows, Strategy.LOOP),
        )
        plan_cache.store(model, cache_key, costs)
    return Strategy.VMAP if costs.vmap_pays else Strategy.LOOP


#: A first timed pull at least this long is kept: the set-up a first call pays (kernels, caches) is
#: then a small part of it, and timing it again would cost a big model's first use seconds.
_SETTLED_SECONDS = 0.5


def _pull_seconds(model: nn.Module, head: nn.Linear | None, rows: Tensor, strategy: Strategy | str) -> float:
    """Seconds per row and cotangent of pulls by ``strategy`` on ``rows``: vmap a full step (it
    pulls VMAP_STEP cotangents whatever fewer are asked for), the loop two cotangents."""
    count = VMAP_STEP if Strategy(strategy) is Strategy.VMAP else 2
    pb = Pullback(model, rows, head, strategy=strategy)
    cotangents = torch.ones(count, *pb.features.shape, dtype=pb.features.dtype, device=rows.device)
    seconds = math.inf
    for _ in range(2):  # the second timing kept: first calls build kernels
        start = time.perf_counter()
        pb.pull(cotangents)
        sync(rows.device)
        elapsed = time.perf_counter() - start
        seconds = elapsed / (len(rows) * count)
        if elapsed >= _SETTLED_SECONDS:
            break
    return seconds


__all__ = ["PullCosts", "pull_strategy"]
