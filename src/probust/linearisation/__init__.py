"""How Taylor and MMSE linearise the margins: the one package that takes margin gradients.

The rest of probust imports this door, never the modules underneath (an import-linter
contract). It sits below :mod:`probust.execution`, which plans how its passes run, and above
:mod:`probust.mvn` and :mod:`probust.noise`; a call goes down through it and stays down:

- :mod:`~probust.linearisation.routes`: each point's route to its margin gradients, chosen by
  counts (:func:`linearise`, :class:`Context`, :func:`check_settings`);
- :mod:`~probust.linearisation.screening`: the spectral and sketch screenings and the bounds
  that drop far boundaries within the mvn-cdf's error budget;
- :mod:`~probust.linearisation.exact`: the exact gradients of each route, pulled on one kept
  forward pass;
- :mod:`~probust.linearisation.pullback`: the gradient engine (loop, vmap, forward mode, the
  fallback; :class:`JacobianPlan`) and the margins;
- :mod:`~probust.linearisation.margins`: whole margin Jacobians and forward-mode sketches;
- :mod:`~probust.linearisation.head`: the model's linear head and the boundaries through it;
- :mod:`~probust.linearisation.forward_mode`: lean forward-mode rules for convolutions,
  linear layers and batch norm;
- :mod:`~probust.linearisation.counting`: the declared cost model the routes are counted by.
"""

from probust.linearisation.counting import (
    ROUTE_NAMES,
    SCREENING_SHARE,
    SPECTRAL_PROBES,
    SPECTRAL_STAGES,
    DeclaredCosts,
    RouteCounts,
    declared,
    forward_may_decide,
    jvp_in_pulls,
    route_counts,
)
from probust.linearisation.head import find_linear_head
from probust.linearisation.margins import logit_jacobian, margin_gradients, margin_jacobian, margin_sketch
from probust.linearisation.pullback import (
    STRATEGIES,
    VMAP_STEP,
    JacobianPlan,
    Strategy,
    TraceFallbackWarning,
    cannot_trace,
    forward_mode_runs,
    margins,
    other_classes,
    pull_back,
)
from probust.linearisation.routes import (
    FORCING,
    GRADIENTS,
    Context,
    Routed,
    check_settings,
    linearise,
)
from probust.linearisation.screening import PROBES, PRUNE_CHOICES, SCREENINGS, Pruned, by_width

__all__ = [
    "FORCING",
    "GRADIENTS",
    "PROBES",
    "PRUNE_CHOICES",
    "ROUTE_NAMES",
    "SCREENINGS",
    "SCREENING_SHARE",
    "SPECTRAL_PROBES",
    "SPECTRAL_STAGES",
    "STRATEGIES",
    "VMAP_STEP",
    "Context",
    "DeclaredCosts",
    "JacobianPlan",
    "Pruned",
    "Routed",
    "Strategy",
    "TraceFallbackWarning",
    "by_width",
    "cannot_trace",
    "check_settings",
    "declared",
    "find_linear_head",
    "forward_mode_runs",
    "jvp_in_pulls",
    "linearise",
    "logit_jacobian",
    "margin_gradients",
    "margin_jacobian",
    "margin_sketch",
    "margins",
    "other_classes",
    "pull_back",
    "route_counts",
    "forward_may_decide",
    "RouteCounts",
]
