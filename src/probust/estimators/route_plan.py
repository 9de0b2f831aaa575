"""How a Taylor or MMSE estimator's margin gradients are computed for points like a batch: the
routes' context, planned once per call plan before the maths.

:func:`route_context` counts (the declared cost model, :func:`probust.linearisation.route_counts`:
C, the head's width, the input size, forward mode's declared cost once one untimed probe shows it
runs), then asks execution for the Jacobian plan the routes run by (declared);
:func:`every_gradient` is the context that takes every margin's gradient from the logits.
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

from torch import Tensor, nn

from probust import linearisation
from probust.errors import OptionError
from probust.linearisation import JacobianPlan, find_linear_head

if TYPE_CHECKING:
    from probust.estimators.linearised import Linearised

__all__ = ["every_gradient", "route_context"]


def route_context(est: Linearised, x: Tensor) -> linearisation.Context:
    """How the margin gradients of points like ``x`` are computed: the settings of
    :func:`probust.linearisation.routes.linearise`, which chooses a route per point from counts
    (the model's linear head, screenings that prune the boundaries that cannot matter,
    forward mode, or every gradient), or takes the forced one. Where nothing but every
    gradient pays (``prune="off"`` with ``gradients`` "auto", "direct" or "forward", or a
    model too small in classes for any other route to pay), and with ``differentiable`` (or
    a model that is not a module): every gradient, every boundary kept
    (:func:`every_gradient`).

    Decided from counts and the declared cost model (:mod:`probust.linearisation.counting`)
    before any pass runs: C, the head's width, the input size and the probes'
    declared cost. Forward mode counts only where one untimed probe shows it runs."""
    # The autograd graph is kept through every gradient only; a model that is not a module has
    # no head to find and no forward mode to probe.
    every = est.differentiable or not isinstance(est.model, nn.Module)
    if every or (est.prune == "off" and est.gradients != "head"):
        return every_gradient(est, x)
    classes = est.execution.classes(est.model, x)
    inputs = x[0].numel()
    # Boundaries may be left out only within the mvn-cdf's error budget, under Gaussian tails.
    prune = est.prune != "off" and est.cdf == "mvn" and not est.p_fail and est.noise.is_gaussian
    # Each point's route is chosen (by counts) only where neither setting forces one.
    chooses = est.gradients == "auto" and est.prune == "auto"
    head = find_linear_head(est.model, x[:1])
    # Forward mode at its declared cost, unless it cannot run through the model: probed
    # (untimed) here where it would decide the route (a forced one, or D probes below the
    # reverse routes' passes), else only once a point's route wants the sketch.
    costs = est.execution.declared_costs(x.device)
    jvp = costs.jvp
    forced_forward = est.gradients == "forward" or est.prune == "sketch"
    if forced_forward or (chooses and linearisation.forward_may_decide(head, classes, inputs, jvp)):
        if not linearisation.forward_mode_runs(est.model, x):
            if forced_forward:
                field = "gradients" if est.gradients == "forward" else "prune"
                raise OptionError(
                    f"{getattr(est, field)!r} needs forward mode (torch.func.jvp), which cannot run through "
                    "this model; use " + ("'auto' or 'direct'" if field == "gradients" else "'spectral' or 'auto'"),
                    field=field,
                )
            jvp = math.inf
    counts = linearisation.route_counts(
        head, classes, inputs, jvp, costs.share, chooses=chooses, prune=prune, spectral=est.prune == "spectral"
    )
    if not counts.pays:
        return every_gradient(est, x)  # nothing pays but every gradient, one pass each
    plan = est.execution.jacobian_plan(
        est.model,
        x,
        x.shape[0] * est.copies,
        # A forward-mode plan serves only the forward route; where another exact route is
        # cheaper no point takes it (per point the head's cost only falls), and the pulls
        # would run by the loop.
        forward=est.gradients == "forward",
        offer_forward=counts.offer_forward,
    )
    return _context(
        est,
        x,
        plan,
        head=head,
        prune=prune,
        jvp=jvp,
        share=costs.share,
        gradients=est.gradients,
        screening=est.prune if est.prune in linearisation.SCREENINGS else "auto",
        spectral_stages=costs.spectral_stages,
        spectral=counts.spectral,
        pull_rows=est.execution.pull_rows(est.model, x, plan, est.copies),
        graph_rows=est.execution.graph_rows(est.model, x, plan),
    )


def _context(est: Linearised, x: Tensor, plan: JacobianPlan, **fields: Any) -> linearisation.Context:
    """The routes' context under ``plan``: this estimator's model, noise, ``tol`` and seed,
    the forward-mode rows of points like ``x``, and ``fields``."""
    return linearisation.Context(
        model=est.model,
        plan=plan,
        noise=est.noise,
        tol=est.tol,
        seed=est.seed,
        probe_rows=est.execution.forward_mode_rows(est.model, x, plan),
        **fields,
    )


def every_gradient(est: Linearised, x: Tensor) -> linearisation.Context:
    """The routes' context that takes every margin's gradient and keeps every boundary: one
    backward pass per boundary from the logits, or forward mode where the plan takes it (asked
    for, or paying by counts: :meth:`probust.execution.Execution.jacobian_plan`, where neither
    ``gradients`` nor ``jacobian`` is fixed), keeping the autograd graph with ``differentiable``."""
    plan = _jacobian_plan(est, x, x.shape[0] * est.copies)
    # No screening shares a pass here, so the passes keep the plan's rows.
    costs = est.execution.declared_costs(x.device)
    return _context(
        est,
        x,
        plan,
        head=None,
        prune=False,
        jvp=costs.jvp,
        share=costs.share,
        gradients="forward" if plan.strategy.whole_jacobian else "direct",
        pull_rows=plan.rows,
        graph_rows=plan.rows,
        differentiable=est.differentiable,
        every_boundary=True,
    )


def _jacobian_plan(est: Linearised, x: Tensor, rows: int) -> JacobianPlan:
    """How :func:`every_gradient` differentiates ``rows`` rows like ``x``
    (:meth:`probust.execution.Execution.jacobian_plan`)."""
    return est.execution.jacobian_plan(
        est.model,
        x,
        rows,
        differentiable=est.differentiable,
        forward=est.gradients == "forward",
        offer_forward=est.gradients == "auto",
    )
