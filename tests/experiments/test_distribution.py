"""Experiment 10 (distribution)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from probust import experiments
from tests._helpers import SIGMAS, assert_figures


def test_distribution_quantiles_and_models_table(results, results_dir, out_dir):
    out = experiments.run("distribution", results, out_dir)
    assert_figures(out)
    t = out.table
    assert len(t) == 3 * len(SIGMAS) * 2 + len(SIGMAS)  # the robust-loss model has mc only
    for row in t.itertuples():
        w = results.by_label(row.model).wide(core=True)
        v = w[w.sigma == row.sigma][f"p_{row.method}"].to_numpy()
        assert row.mean == pytest.approx(v.mean()) and row.median == pytest.approx(np.median(v))
        assert row.q25 == pytest.approx(np.quantile(v, 0.25))
    models = out.tables["models"]
    assert list(models["model"]) == [
        "digits linear",
        "digits linear, λ=0.05",
        "digits linear, robust μ=1 (σ=0.3)",
        "digits CNN",
    ]
    assert (
        list(models["robust_loss_mu"].isna()) == [True, True, False, True]
        and models["robust_loss_sigma"].iloc[2] == 0.3
    )
    for row in models.itertuples():
        name = {
            "digits linear": "linear-0",
            "digits linear, λ=0.05": "linear-0.05",
            "digits CNN": "cnn-0",
            "digits linear, robust μ=1 (σ=0.3)": "linear-robust",
        }[row.model]
        meta = json.loads((results_dir / "models" / f"{name}.pt.json").read_text())
        assert row.test_accuracy == pytest.approx(meta["test_accuracy"])
        assert row.architecture == meta["arch"] and row.dataset == "digits"
