"""CERTIFY and PREDICT default to Cohen et al.'s settings, as their docstrings state: n0 = 100
selection draws, n = 100,000 estimation draws, alpha = 0.001 (and futility 0.001 for the
sequential form), in the classes and in the functions alike."""

from __future__ import annotations

import inspect

from torch import nn

import probust
from probust.smoothing import Certify, Predict

COHEN = {"n0": 100, "n": 100_000, "alpha": 0.001}


def test_certify_defaults_to_cohens_settings():
    made = Certify(nn.Linear(3, 2), 0.25)
    assert (made.n0, made.n, made.alpha, made.futility, made.radii) == (100, 100_000, 0.001, 0.001, None)
    assert made.procedure == "fixed" and Certify(nn.Linear(3, 2), 0.25, radii=[0.1]).procedure == "prior"
    defaults = {k: v.default for k, v in inspect.signature(probust.certify).parameters.items() if k in COHEN}
    assert defaults == COHEN


def test_predict_defaults_to_cohens_settings():
    made = Predict(nn.Linear(3, 2), 0.25)
    assert (made.n, made.alpha) == (100_000, 0.001)
    defaults = {k: v.default for k, v in inspect.signature(probust.predict).parameters.items() if k in COHEN}
    assert defaults == {"n": 100_000, "alpha": 0.001}
