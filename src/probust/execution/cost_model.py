"""The declared cost model that decides which gradients Taylor and MMSE take: counts, no clock.

Each point's route (:mod:`probust.estimators.routes`) weighs passes against each other in
backward passes of one row ("pulls"). A pull and a forward-mode probe (one Jacobian-vector
product of one row) are the two units; their ratio is declared here per device kind, not
measured, so that what is computed (which boundaries get exact gradients, whether a screening
runs, and so which are dropped) depends on the model's counts alone: C, the head's width and
live features, the input size and ``tol``. Measured timings may still choose how the same passes
run (rows per pass, memory format, loop or vmap), which changes speed and float rounding only.

Whether forward mode runs through a model at all is a fact about the model, found once by one
untimed probe (:func:`probust.gradients.forward_mode_runs`).
"""

from __future__ import annotations

import torch

#: A forward-mode probe of one row in pulls of one row, by device kind. Measured on this
#: project's 2-core CPU (torch 2.14, probes vmapped over one forward pass, probust._forward_mode's
#: lean tangent rules): 1.3 for resnet18 and 1.1-1.3 for resnet50 at 3 x 224 x 224, 5-8 for
#: models whose passes take well under a millisecond (fixed costs of vmap), where every route is
#: cheap anyway. The GPU figure is the CPU's: on an H200 a probe's kernels cost 0-0.34 pulls at 1-16
#: rows (the GPU mostly idle) and a forward-mode pass costs torch.func's Python work per layer,
#: which counts of passes do not describe (benchmarks/bench_cost_model.py, docs/performance.md).
JVP_IN_PULLS: dict[str, float] = {"cpu": 1.5, "cuda": 1.5}


def jvp_in_pulls(device: torch.device) -> float:
    """A forward-mode probe's declared cost in pulls on ``device`` (:data:`JVP_IN_PULLS`)."""
    return JVP_IN_PULLS.get(device.type, JVP_IN_PULLS["cpu"])


__all__ = ["JVP_IN_PULLS", "jvp_in_pulls"]
