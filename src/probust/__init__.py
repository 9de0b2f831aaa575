"""probust: average-case robustness of classifiers.

p_robust(x) is the probability that a classifier's prediction at x survives random noise
of scale sigma. The estimators share one call convention::

    import probust
    r = probust.MMSE(model, sigma=0.1, n_samples=5)(x)   # x [B, ...] -> Estimate, r.p float64 [B]
    p = probust.estimate(model, x, sigma=0.1, method="taylor")

Randomized smoothing (Cohen et al.'s certified L2 radius; :mod:`probust.smoothing`)::

    c = probust.certify(model, x, sigma=0.25)   # c.prediction int64 [B] (-1: abstain), c.radius float64 [B]

``pip install probust`` needs torch, numpy and scipy only and gives all of the above. The runner
(``probust.run_estimate``, ``probust estimate``), the report, the data sets and Hugging Face
models are extras (``pip install 'probust[all]'``); a missing one is named in the error.
"""

from probust.estimators import (
    METHODS,
    MMSE,
    Estimate,
    Estimator,
    LinearisationWarning,
    MonteCarlo,
    MonteCarloCV,
    MonteCarloIS,
    Softmax,
    Taylor,
    estimate,
    make_estimator,
)
from probust.execution import Execution
from probust.models import Normalize, with_normalization
from probust.mvn import mvn_cdf, mvn_sf
from probust.noise import Gaussian, Laplace, Noise, Uniform
from probust.smoothing import Certify, CertifyResult, Predict, PredictResult, certify, predict, radius_estimate
from probust.training import RobustLoss

__version__ = "0.4.0"


#: What ``import probust`` gives on first use only, as (module, attribute or None for the module
#: itself, the extra it needs): each pulls in an extra's packages (pandas, torchmetrics, ...).
_LAZY: dict[str, tuple[str, str | None]] = {
    "run_estimate": ("probust.run", "run_estimate"),
    "score": ("probust.run.score", "score"),
    "find_issues": ("probust.issues", "find_issues"),
    "issues": ("probust.issues", None),
    "data": ("probust.data", None),
    "run": ("probust.run", None),
    "metrics": ("probust.metrics", None),
    "plots": ("probust.plots", None),
}


def __dir__() -> list[str]:
    """Every public name, the lazy ones (``score``, ``find_issues``, ...) included: tab completion."""
    return sorted(set(globals()) | set(_LAZY))


def __getattr__(name: str):
    if name not in _LAZY:
        raise AttributeError(f"module 'probust' has no attribute {name!r}")
    import importlib

    from probust._extras import missing_extra

    module_name, attribute = _LAZY[name]
    feature = f"probust.{name}"
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        error = missing_extra(exc, feature)
        if error is None:
            raise
        raise error from exc
    return module if attribute is None else getattr(module, attribute)


__all__ = [
    "METHODS",
    "MMSE",
    "Certify",
    "CertifyResult",
    "Estimate",
    "Estimator",
    "Execution",
    "Gaussian",
    "Laplace",
    "LinearisationWarning",
    "MonteCarlo",
    "MonteCarloCV",
    "MonteCarloIS",
    "Noise",
    "Normalize",
    "Predict",
    "PredictResult",
    "RobustLoss",
    "Softmax",
    "Taylor",
    "Uniform",
    "__version__",
    "certify",
    "estimate",
    "find_issues",
    "make_estimator",
    "mvn_cdf",
    "mvn_sf",
    "predict",
    "radius_estimate",
    "run_estimate",
    "score",
    "with_normalization",
]
