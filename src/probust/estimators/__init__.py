"""The estimators of average-case robustness, all called the same way, and the method registry.

    est = probust.Taylor(model, sigma=0.1)
    r = est(x)                  # x [B, *S] -> Estimate; r.p float64 [B]
    p = probust.estimate(model, x, 0.1, "mmse")

One file per method family over one base (:mod:`~probust.estimators.base`); the registry
(:mod:`~probust.estimators.registry`) is what the functional API, the runner, the CLI, the demo
and the figures read.
"""

from probust.estimators.base import Estimator
from probust.estimators.control_variate import MonteCarloCV
from probust.estimators.functional import estimate, make_estimator
from probust.estimators.importance import MonteCarloIS
from probust.estimators.linearised import CDFS, Linearisation, Linearised
from probust.estimators.linearised_mc import LINEARISATIONS, LinearisedMonteCarlo
from probust.estimators.mmse import MMSE
from probust.estimators.monte_carlo import MonteCarlo
from probust.estimators.registry import METHODS, PAPER_METHODS, REGISTRY, MethodSpec, method_spec, methods_with
from probust.estimators.result import Estimate
from probust.estimators.softmax import Softmax
from probust.estimators.taylor import Taylor
from probust.estimators.trust import LinearisationWarning, untrusted

__all__ = [
    "CDFS",
    "LINEARISATIONS",
    "METHODS",
    "MMSE",
    "PAPER_METHODS",
    "REGISTRY",
    "Estimate",
    "Estimator",
    "Linearisation",
    "Linearised",
    "LinearisationWarning",
    "LinearisedMonteCarlo",
    "MethodSpec",
    "MonteCarlo",
    "MonteCarloCV",
    "MonteCarloIS",
    "Softmax",
    "Taylor",
    "estimate",
    "make_estimator",
    "method_spec",
    "methods_with",
    "untrusted",
]
