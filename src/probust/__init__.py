"""probust: average-case robustness of classifiers.

p_robust(x) is the probability that a classifier's prediction at x survives random noise
of scale sigma. The estimators share one call convention::

    import probust
    r = probust.MMSE(model, sigma=0.1, n_samples=5)(x)   # x [B, ...] -> Estimate, r.p float64 [B]
    p = probust.estimate(model, x, sigma=0.1, method="taylor")
"""

from probust.estimators import MMSE, Estimator, MonteCarlo, Softmax, Taylor
from probust.functional import METHODS, estimate, make_estimator
from probust.mvn import mvn_cdf
from probust.noise import Gaussian, Laplace, Noise, Uniform
from probust.result import Estimate

__version__ = "0.1.0"

__all__ = [
    "METHODS",
    "MMSE",
    "Estimate",
    "Estimator",
    "Gaussian",
    "Laplace",
    "MonteCarlo",
    "Noise",
    "Softmax",
    "Taylor",
    "Uniform",
    "__version__",
    "estimate",
    "make_estimator",
    "mvn_cdf",
]
