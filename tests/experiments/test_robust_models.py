"""Experiment 6 (robust_models)."""

from __future__ import annotations

import numpy as np

from probust import experiments
from probust.experiments.runs import Results
from tests._helpers import SIGMAS, assert_figures


def test_robust_models_compares_the_family_members(results, out_dir):
    out = experiments.run("robust_models", results, out_dir)
    assert_figures(out)
    t = out.table
    assert set(t["model"]) == {"digits linear", "digits linear, λ=0.05"}
    assert sorted(t["grad_reg"].unique()) == [0.0, 0.05]
    assert len(t) == 2 * len(SIGMAS) * 5
    first = experiments.run("estimation_error", results, out_dir).table
    merged = t.merge(first, on=["model", "sigma", "method"], suffixes=("", "_1"))
    np.testing.assert_allclose(merged["mean_abs_error"], merged["mean_abs_error_1"])


def test_robust_models_is_skipped_without_a_family(results, out_dir):
    single = Results(root=results.root, runs=[results.by_label("digits CNN")])
    out = experiments.run("robust_models", single, out_dir / "single")
    assert out.skipped and "λ" in out.skipped and not out.figures
