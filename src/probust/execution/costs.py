"""What a model's passes cost, in seconds per row: the units the routes of Taylor and MMSE
(:mod:`probust.estimators.routes`) weigh each other by.

Measured once per model, input shape and Jacobian plan, and kept like plans (per model object in
memory, by structure on disk: :mod:`probust.execution.plan_cache`).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace

import torch
from torch import Tensor, nn

from probust import _forward_mode as forward_mode
from probust.execution import plan_cache
from probust.execution.tuning import PLANNING_SHARE, VMAP_PAYS, JacobianPlan, sync, to_format, torch_func_startup
from probust.pullback import VMAP_STEP, Pullback, features_and_logits

# vmap pads every pull to VMAP_STEP cotangents, and the routes' pulls are narrow (8 probes, then a
# few candidates: 9 run as 16): they take vmap only where it is VMAP_PAYS cheaper per cotangent.


@dataclass(frozen=True)
class UnitCosts:
    """Seconds per row of a model's passes (measured once per model, input shape and plan).

    Attributes:
        forward: one forward pass with autograd.
        pull: one pullback (backward pass) of one cotangent.
        jvp: one forward-mode Jacobian-vector product; inf where forward mode cannot run (or was not
            timed: a call too small to pay for it); NaN only inside the cache (not timed yet).
        loop_pull: one pullback of one cotangent by its own backward pass (the "loop"), where the
            plan pulls with vmap (``pull`` is then one cotangent's share of a vmapped step); equal
            to ``pull`` for other plans. (A cache entry of an earlier release, without it, is
            measured again.)
    """

    forward: float
    pull: float
    jvp: float
    loop_pull: float

    @property
    def vmap_pays(self) -> bool:
        """Whether the routes pull with vmap (where the plan does): one cotangent's share of a
        vmapped step costs at most :data:`VMAP_PAYS` of a pull by its own backward pass."""
        return self.pull <= VMAP_PAYS * self.loop_pull

    @property
    def route_pull(self) -> float:
        """Seconds per row of one of the routes' pulls, by the strategy they take."""
        return self.pull if self.vmap_pays else self.loop_pull

    @property
    def jvp_in_pulls(self) -> float:
        """A forward-mode probe's cost in the routes' pullbacks."""
        return self.jvp / max(self.route_pull, 1e-12)


def unit_costs(
    model: nn.Module, head: nn.Linear | None, x: Tensor, plan: JacobianPlan, work: float, *, forward_mode: bool = False
) -> UnitCosts:
    """:class:`UnitCosts` of ``model`` on rows like ``x`` under ``plan`` (cached like plans).

    Two rows, each pass timed twice and the second kept (first calls build kernels): a few
    passes. Forward mode is timed only where that fits the planning share of the call
    (``work``: the call's pullbacks of one row): its first use in a process imports torch's
    compiler stack (seconds), so a small call leaves it out (``jvp`` inf until a call large
    enough, or ``forward_mode``: a route that needs it was asked for). Each part is measured
    once per model, shape and plan: the reverse-mode costs are kept while ``jvp`` waits.
    """
    key = ("route-costs", x.device, x.dtype, tuple(x.shape[1:]), plan.strategy, plan.channels_last, head is None)
    cache_key = plan_cache.plan_key(model, x.device, key)
    stored = plan_cache.lookup(model, cache_key, UnitCosts)
    rows = to_format(x[:1].expand(2, *x.shape[1:]).contiguous(), plan.channels_last)
    started = time.perf_counter()
    if isinstance(stored, UnitCosts):
        costs = stored
    else:
        costs = _reverse_costs(model, head, rows, plan)
        plan_cache.store(model, cache_key, costs)
    # NaN: forward mode not timed yet; inf: timed and unavailable.
    if not math.isnan(costs.jvp):
        return costs
    spent = time.perf_counter() - started
    # Timing forward mode: two probes of two rows, about as long as a forward pass and two pulls per row, twice.
    timing = 4 * (costs.forward + 2 * costs.route_pull)
    if not forward_mode and spent + torch_func_startup() + timing > PLANNING_SHARE * work * costs.route_pull:
        return replace(costs, jvp=math.inf)
    costs = replace(costs, jvp=_jvp_cost(model, head, rows, costs.forward))
    plan_cache.store(model, cache_key, costs)
    return costs


#: A first timed pass at least this long is kept: the set-up a first call pays (kernels, caches) is
#: then a small part of it, and timing it again would cost a big model's first use seconds (two
#: rows of resnet50 at 224 x 224: about 1 s forward and backward, 1.3 s in forward mode).
_SETTLED_SECONDS = 0.5


def _reverse_costs(model: nn.Module, head: nn.Linear | None, rows: Tensor, plan: JacobianPlan) -> UnitCosts:
    """Forward and pullback seconds per row on two ``rows`` (``jvp`` NaN: not measured)."""
    strategy = plan.strategy if plan.strategy in ("loop", "vmap") else "loop"
    # vmap pulls VMAP_STEP cotangents at a time whatever fewer are asked for: time a full step,
    # or the padding would be counted as the cost of the two cotangents asked for (4x at 8).
    count = VMAP_STEP if strategy == "vmap" else 2
    forward = pull = math.inf
    for _ in range(2):
        start = time.perf_counter()
        pb = Pullback(model, rows, head, strategy=strategy)
        sync(rows.device)
        middle = time.perf_counter()
        pb.pull(torch.ones(count, *pb.features.shape, dtype=pb.features.dtype, device=rows.device))
        sync(rows.device)
        end = time.perf_counter()
        forward, pull = (middle - start) / 2, (end - middle) / (2 * count)
        if end - start >= _SETTLED_SECONDS:
            break  # a first pass this long is the model's work, not its set-up: no second one
    loop_pull = pull
    if strategy == "vmap":
        loop_pull = _loop_pull_cost(model, head, rows)
    return UnitCosts(forward=forward, pull=pull, jvp=math.nan, loop_pull=loop_pull)


def _loop_pull_cost(model: nn.Module, head: nn.Linear | None, rows: Tensor) -> float:
    """Seconds per row of one pullback by its own backward pass (two cotangents on ``rows``)."""
    pull = math.inf
    pb = Pullback(model, rows, head, strategy="loop")
    cotangents = torch.ones(2, *pb.features.shape, dtype=pb.features.dtype, device=rows.device)
    for _ in range(2):
        start = time.perf_counter()
        pb.pull(cotangents)
        sync(rows.device)
        pull = (time.perf_counter() - start) / 4
        if 4 * pull >= _SETTLED_SECONDS:
            break  # as in _reverse_costs
    return pull


def _jvp_cost(model: nn.Module, head: nn.Linear | None, rows: Tensor, forward: float) -> float:
    """Seconds per row of one forward-mode probe on ``rows`` (inf where forward mode cannot run).

    Two probes of the rows in one pass, as the routes run them (``forward_mode.jvps``: the model's
    own pass runs once for all of a pass's probes): the pass's time less one forward pass
    (``forward`` seconds per row), at most half of it, per probe and row.
    """
    jvp = math.inf
    import torch._dynamo  # noqa: F401 - torch.func's one-time import (seconds), not a probe's cost

    probes = 2
    tangents = torch.cat([torch.ones_like(rows)] * probes).view(probes, *rows.shape)
    try:
        for _ in range(2):
            with torch.no_grad():
                start = time.perf_counter()
                forward_mode.jvps(features_and_logits(model, head), rows, tangents)
                sync(rows.device)
                elapsed = time.perf_counter() - start
            jvp = max(elapsed - forward * len(rows), elapsed / 2) / (probes * len(rows))
            if elapsed >= _SETTLED_SECONDS:
                break  # as in _reverse_costs
    except (RuntimeError, NotImplementedError, AttributeError, TypeError):
        jvp = math.inf
    return jvp


__all__ = ["UnitCosts", "unit_costs"]
