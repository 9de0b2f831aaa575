"""The declared cost model that decides which gradients Taylor and MMSE take: counts, no clock.

Each point's route (:mod:`probust.linearisation.routes`) weighs passes against each other in
backward passes of one row ("pulls"). A pull and a forward-mode probe (one Jacobian-vector
product of one row) are the two units; their ratio, and the share of the best route that the
screenings may cost, are declared here per device kind, not measured, so that what is computed
(which boundaries get exact gradients, whether a screening runs, and so which are dropped)
depends on the model's counts alone: C, the head's width and live features, the input size and
``tol``. Measured timings may still choose how the same passes run (rows per pass, memory
format, loop or vmap), which changes speed and float rounding only.

Whether forward mode runs through a model at all is a fact about the model, found once by one
untimed probe (:func:`probust.linearisation.pullback.forward_mode_runs`).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
from torch import nn

from probust.linearisation.screening import PROBES

#: The routes a point can take, by name, as ``Estimate.route`` records them (an index into this).
ROUTE_NAMES = ("direct", "head", "forward", "candidates")
#: Indices into :data:`ROUTE_NAMES`.
DIRECT, HEAD, FORWARD, CANDIDATES = 0, 1, 2, 3

#: The most reverse-mode probes of the spectral screening (its last stage's, on every device kind:
#: :data:`SPECTRAL_STAGES`).
SPECTRAL_PROBES = 8
#: The spectral screening runs only where its cost is at most this share of the cheapest exact route.
RHO = 0.1

#: A forward-mode probe of one row in pulls of one row, by device kind. On a CPU a probe (vmapped
#: over one forward pass, with probust.linearisation.forward_mode's lean tangent rules) costs about a pull on
#: large convolutional nets, several on models whose passes take well under a millisecond, where
#: every route is cheap anyway. CUDA takes the CPU's figure: a probe's kernels cost next to
#: nothing there, but a forward-mode pass pays torch.func's Python work per layer, which counts of
#: passes do not describe (benchmarks/bench_cost_model.py; docs/performance.md, "Routes at many
#: classes" and "The declared cost model on CUDA").
JVP_IN_PULLS: dict[str, float] = {"cpu": 1.5, "cuda": 1.5}


#: The share of the best route that the screenings may cost together, by device kind: where both
#: drop nothing, a point costs at most this much more than that route. The sketch runs only where
#: it and the spectral screening before it fit this share of the best route after the spectral one.
#: CPU: 0.5. A smaller share leaves out the sketch where it pays: a resnet18 point with a
#: 1,000-class head whose spectral screening keeps a few hundred boundaries then pulls each of
#: them, several times what the sketch costs, which leaves the few that matter; at 0.1 resnet50
#: takes no screening and pulls all 999. CUDA: 0.2, since there those pulls, batched by vmap,
#: cost less than one forward-mode pass, which pays torch.func's Python work per layer that the
#: counts do not see (docs/performance.md, "Routes at many classes" and "The screening share on
#: CUDA").
SCREENING_SHARE: dict[str, float] = {"cpu": 0.5, "cuda": 0.2}


#: The spectral screening's reverse-mode probes, in stages, by device kind: the screening bounds
#: every z from the first stage's probes, and adds the next stage's only on the points where the
#: most they could give (:func:`probust.linearisation.screening.spectral_z_best`) would drop more
#: boundaries than its probes cost (the screening of :mod:`probust.linearisation.routes`).
#: CPU: the routes pull by the loop (one backward pass per cotangent), so 4 probes cost half of 8;
#: where the far classes lie far (a ViT at 224 x 224) or no such bound could drop them (resnet50),
#: 4 suffice. CUDA: pulls run by vmap, padded to :data:`probust.linearisation.pullback.VMAP_STEP` = 8
#: cotangents, so a stage of 4 costs what 8 do: one stage.
SPECTRAL_STAGES: dict[str, tuple[int, ...]] = {"cpu": (4, 8), "cuda": (8,)}


def jvp_in_pulls(device: torch.device) -> float:
    """A forward-mode probe's declared cost in pulls on ``device`` (:data:`JVP_IN_PULLS`)."""
    return JVP_IN_PULLS.get(device.type, JVP_IN_PULLS["cpu"])


def screening_share(device: torch.device | str) -> float:
    """The screenings' declared share of the best route on ``device`` (:data:`SCREENING_SHARE`)."""
    kind = torch.device(device).type
    return SCREENING_SHARE.get(kind, SCREENING_SHARE["cpu"])


def spectral_stages(device: torch.device | str) -> tuple[int, ...]:
    """The spectral screening's probes after each stage on ``device`` (:data:`SPECTRAL_STAGES`)."""
    kind = device if isinstance(device, str) else device.type
    return SPECTRAL_STAGES.get(kind, SPECTRAL_STAGES["cpu"])


class DeclaredCosts(NamedTuple):
    """The cost model of one device kind, as the routes weigh it."""

    #: A forward-mode probe of one row, in pulls of one row (:data:`JVP_IN_PULLS`).
    jvp: float
    #: The screenings' share of the best route (:data:`SCREENING_SHARE`).
    share: float
    #: The spectral screening's probes after each stage (:data:`SPECTRAL_STAGES`).
    spectral_stages: tuple[int, ...]


def declared(device: torch.device) -> DeclaredCosts:
    """The declared costs of ``device``'s kind (a kind with no figures of its own takes the CPU's)."""
    return DeclaredCosts(jvp_in_pulls(device), screening_share(device), spectral_stages(device))


def static_exact(head: nn.Linear | None, classes: int, inputs: int, jvp: float) -> float:
    """Pullbacks per row of the cheapest route that computes every gradient, before seeing a point
    (the head's every feature alive; forward mode at ``jvp`` pulls per probe, inf: not available)."""
    options = [float(classes - 1)]
    if head is not None and head.in_features + 1 < classes - 1:
        options.append(head.in_features + 1.0)
    if inputs < classes - 1:
        options.append(inputs * jvp)
    return min(options)


def forward_may_decide(head: nn.Linear | None, classes: int, inputs: int, jvp: float) -> bool:
    """Whether forward mode, at ``jvp`` pulls per probe, is cheaper than every reverse-mode route
    that gives every gradient (then whether it runs through the model decides the route)."""
    return inputs * jvp < static_exact(head, classes, inputs, math.inf)


class RouteCounts(NamedTuple):
    """What the counts of a model say about the routes of points like a batch, before any point."""

    #: Pulls per row of the cheapest route that gives every gradient (:func:`static_exact`).
    exact: float
    #: Whether the spectral screening runs.
    spectral: bool
    #: Whether any route but every gradient from the logits can pay.
    pays: bool
    #: Whether forward mode may serve a route (it runs, and it costs at most ``exact``).
    offer_forward: bool


def route_counts(
    head: nn.Linear | None,
    classes: int,
    inputs: int,
    jvp: float,
    share: float,
    *,
    chooses: bool,
    prune: bool,
    spectral: bool,
) -> RouteCounts:
    """The routes' counts for a model with ``classes`` classes, ``inputs`` input coordinates and
    linear head ``head`` (None: none), forward mode at ``jvp`` pulls per probe (inf: it does not
    run) and the screenings' declared ``share``.

    Args:
        chooses: each point's route is chosen by counts (neither ``gradients`` nor ``prune`` forces one).
        prune: boundaries may be left out (the mvn-cdf, Gaussian noise, no ``p_fail``).
        spectral: the spectral screening is forced.
    """
    exact = static_exact(head, classes, inputs, jvp)
    spectral = spectral or (
        chooses and prune and SPECTRAL_PROBES <= RHO * static_exact(head, classes, inputs, math.inf)
    )
    sketch_could_pay = prune and SPECTRAL_PROBES * spectral + PROBES * jvp <= share * exact
    pays = not chooses or exact < classes - 1 or spectral or sketch_could_pay
    offer_forward = chooses and math.isfinite(jvp) and inputs * jvp <= exact
    return RouteCounts(exact, spectral, pays, offer_forward)


__all__ = [
    "RHO",
    "SPECTRAL_PROBES",
    "DeclaredCosts",
    "RouteCounts",
    "forward_may_decide",
    "route_counts",
    "static_exact",
    "JVP_IN_PULLS",
    "SCREENING_SHARE",
    "SPECTRAL_STAGES",
    "declared",
    "jvp_in_pulls",
    "screening_share",
    "spectral_stages",
]
