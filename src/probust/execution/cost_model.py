"""The declared cost model that decides which gradients Taylor and MMSE take: counts, no clock.

Each point's route (:mod:`probust.estimators.routes`) weighs passes against each other in
backward passes of one row ("pulls"). A pull and a forward-mode probe (one Jacobian-vector
product of one row) are the two units; their ratio, and the share of the best route that the
screenings may cost, are declared here per device kind, not measured, so that what is computed (which boundaries get exact gradients, whether a screening
runs, and so which are dropped) depends on the model's counts alone: C, the head's width and
live features, the input size and ``tol``. Measured timings may still choose how the same passes
run (rows per pass, memory format, loop or vmap), which changes speed and float rounding only.

Whether forward mode runs through a model at all is a fact about the model, found once by one
untimed probe (:func:`probust.gradients.forward_mode_runs`).
"""

from __future__ import annotations

from typing import NamedTuple

import torch

#: A forward-mode probe of one row in pulls of one row, by device kind. Measured on this
#: project's 2-core CPU (torch 2.14, probes vmapped over one forward pass, probust._forward_mode's
#: lean tangent rules): 1.3 for resnet18 and 1.1-1.3 for resnet50 at 3 x 224 x 224, 5-8 for
#: models whose passes take well under a millisecond (fixed costs of vmap), where every route is
#: cheap anyway. The GPU figure is the CPU's: on an H200 a probe's kernels cost 0-0.34 pulls at 1-16
#: rows (the GPU mostly idle) and a forward-mode pass costs torch.func's Python work per layer,
#: which counts of passes do not describe (benchmarks/bench_cost_model.py, docs/performance.md).
JVP_IN_PULLS: dict[str, float] = {"cpu": 1.5, "cuda": 1.5}


#: The share of the best route that the screenings may cost together, by device kind: where both
#: drop nothing, a point costs at most this much more than that route. The sketch runs only where
#: it and the spectral screening before it fit this share of the best route after the spectral one.
#: CPU: at 0.2, one point in four of resnet18 at 224 x 224 (bench_imagenet, sigma 5.62), whose
#: spectral screening kept 213 of 999 boundaries, went without the sketch and pulled 213
#: cotangents: 13.1 s for the 4 points (5.1x the 10-class twin), against 4.5 s at 0.5, where the
#: sketch left the 9 that matter (0.1 left resnet50 on the direct route, 999 pullbacks). CUDA: the
#: same 213 pulls cost less than one forward-mode pass there (a pass costs torch.func's Python work
#: per layer, which the counts do not see): on an H200 the same call took 0.20 and 0.33 s at 0.2
#: against 0.47-0.52 s at 0.5 (2 and 3 runs, alternating; docs/performance.md, "On a GPU").
SCREENING_SHARE: dict[str, float] = {"cpu": 0.5, "cuda": 0.2}


#: The spectral screening's reverse-mode probes, in stages, by device kind: the screening bounds
#: every z from the first stage's probes, and adds the next stage's only where that could drop
#: more boundaries than its probes cost (:func:`probust.estimators.routes.spectral_stage_pays`).
#: CPU: the routes pull by the loop (one backward pass per cotangent), so 4 probes cost half of 8;
#: where the far classes lie far (ViT at 224 x 224: z bounds of about 320 from 8 probes) or no
#: bound could drop them (resnet50: 0.9), 4 suffice. CUDA: pulls run by vmap, padded to
#: :data:`probust.gradients.VMAP_STEP` = 8 cotangents, so a stage of 4 costs what 8 do: one stage.
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


__all__ = [
    "DeclaredCosts",
    "JVP_IN_PULLS",
    "SCREENING_SHARE",
    "SPECTRAL_STAGES",
    "declared",
    "jvp_in_pulls",
    "screening_share",
    "spectral_stages",
]
