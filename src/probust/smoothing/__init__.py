"""Randomized smoothing: certified L2 radii (Cohen, Rosenfeld and Kolter, ICML 2019), batched.

    r = probust.certify(model, x, sigma=0.25)                       # CERTIFY, n = 100,000 draws
    r = probust.certify(model, x, 0.25, radii=[0, 0.25, 0.5, 0.75]) # sequential: draws until decided
    p = probust.predict(model, x, 0.25)                             # PREDICT
    est = probust.radius_estimate(probust.Taylor(model, 0.25)(x), 0.25)   # an estimate, no guarantee

- :mod:`~probust.smoothing.smoothed`: :class:`Certify`, :class:`Predict` and their functions.
- :mod:`~probust.smoothing.result`: :class:`CertifyResult`, :class:`PredictResult`.
- :mod:`~probust.smoothing.stats`: the statistics (Clopper-Pearson, the binomial test, the
  confidence sequence), algorithms only.
- :mod:`~probust.smoothing.analytic`: :func:`radius_estimate` from Taylor or MMSE.

What is certified, and where the noise enters: ``docs/certify.md``.
"""

from probust.smoothing.analytic import radius_estimate
from probust.smoothing.result import ABSTAIN, CertifyResult, PredictResult, certified_accuracy
from probust.smoothing.smoothed import Certify, Predict, certify, isotropic_sigma, predict

__all__ = [
    "ABSTAIN",
    "Certify",
    "CertifyResult",
    "Predict",
    "PredictResult",
    "certified_accuracy",
    "certify",
    "isotropic_sigma",
    "predict",
    "radius_estimate",
]
