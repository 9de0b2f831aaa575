"""The estimators of average-case robustness, all called the same way, and the method registry.

    est = probust.Taylor(model, sigma=0.1)
    r = est(x)                  # x [B, *S] -> Estimate; r.p float64 [B]
    p = probust.estimate(model, x, 0.1, "mmse")

One file per method family over one base (:mod:`~probust.estimators.base`); the registry
(:mod:`~probust.estimators.registry`) is what the functional API, the runner, the CLI, the demo
and the figures read.

The rest of probust enters through this door only: it imports the names below from
``probust.estimators``, never from the modules underneath (``lint-imports`` checks it). Besides
the estimators, the door holds what the runner reads to name and check the same settings
(the defaults, ``RUN_OPTIONS``, and from :mod:`probust.linearisation` ``GRADIENTS``,
``PRUNE_CHOICES``, :func:`check_settings` and ``ROUTE_NAMES``) and what randomized smoothing builds on (:class:`PointwiseMethod`,
:func:`noisy_predictions`, :class:`AffineLogits`, :func:`check_noisy_copies`, :func:`rows_frame`).
"""

from probust.estimators.affine import AffineLogits
from probust.estimators.base import Estimator, PointwiseMethod, check_noisy_copies
from probust.estimators.control_variate import MonteCarloCV
from probust.estimators.functional import estimate, make_estimator
from probust.estimators.importance import MonteCarloIS
from probust.estimators.linearised import CDFS, Linearisation, Linearised
from probust.estimators.linearised_mc import LINEARISATIONS, LinearisedMonteCarlo
from probust.estimators.mmse import DEFAULT_COPIES, MMSE
from probust.estimators.monte_carlo import DEFAULT_CONFIDENCE, DEFAULT_DRAWS, INTERVALS, MonteCarlo, noisy_predictions
from probust.estimators.registry import (
    METHODS,
    PAPER_METHODS,
    REGISTRY,
    RUN_OPTIONS,
    MethodSpec,
    method_spec,
    methods_with,
)
from probust.estimators.result import Estimate, rows_frame
from probust.estimators.softmax import Softmax
from probust.estimators.taylor import Taylor
from probust.estimators.trust import LinearisationWarning, untrusted
from probust.linearisation import GRADIENTS, PRUNE_CHOICES, ROUTE_NAMES, check_settings

__all__ = [
    "INTERVALS",
    "CDFS",
    "DEFAULT_CONFIDENCE",
    "DEFAULT_COPIES",
    "DEFAULT_DRAWS",
    "GRADIENTS",
    "LINEARISATIONS",
    "METHODS",
    "MMSE",
    "PAPER_METHODS",
    "PRUNE_CHOICES",
    "REGISTRY",
    "ROUTE_NAMES",
    "RUN_OPTIONS",
    "AffineLogits",
    "Estimate",
    "Estimator",
    "Linearisation",
    "LinearisationWarning",
    "Linearised",
    "LinearisedMonteCarlo",
    "MethodSpec",
    "MonteCarlo",
    "MonteCarloCV",
    "MonteCarloIS",
    "PointwiseMethod",
    "Softmax",
    "Taylor",
    "check_noisy_copies",
    "check_settings",
    "estimate",
    "make_estimator",
    "method_spec",
    "methods_with",
    "noisy_predictions",
    "rows_frame",
    "untrusted",
]
