"""Experiment 2 (convergence)."""

from __future__ import annotations

import numpy as np
import pytest

from probust import experiments
from tests._helpers import CONV_MC, CONV_MMSE, MC_N, MMSE_N, assert_figures, raw


def test_convergence_uses_the_exact_value_for_the_linear_model_and_mc_otherwise(results, out_dir):
    out = experiments.run("convergence", results, out_dir)
    assert_figures(out)
    t = out.table
    lin = t[(t.model == "digits linear") & (t.estimator == "mc")]
    assert sorted(lin["n_samples"]) == sorted(set(CONV_MC + [MC_N]))  # against the exact value, every n
    assert lin["reference"].str.startswith("exact").all()
    cnn = t[(t.model == "digits CNN") & (t.estimator == "mc")]
    assert sorted(cnn["n_samples"]) == sorted(set(CONV_MC + [MC_N]))[:-1]  # the largest n is the reference
    # recompute one row by hand: CNN, n=100 against Monte Carlo at n=1000 on the six points
    rows = raw(results, "digits CNN")
    rows = rows[(rows.sigma == 0.3) & (rows.method == "mc") & rows["index"].isin(range(6))].pivot(
        index="index", columns="n_samples", values="p"
    )
    ref = rows[1000]
    expected = (rows[100] - ref).abs().mean()
    assert cnn.set_index("n_samples").loc[100, "mean_abs_error"] == pytest.approx(expected)
    theory = np.mean(np.sqrt(2 / np.pi) * np.sqrt(ref * (1 - ref) * (1 / 100 - 1 / 1000)))
    assert cnn.set_index("n_samples").loc[100, "theory_abs_error"] == pytest.approx(theory)
    mm = t[(t.model == "digits linear") & (t.estimator == "mmse")].set_index("n_samples")
    assert sorted(mm.index) == sorted(set(CONV_MMSE + [MMSE_N]))
    # centred MMSE is exact for a linear model from N = 2 on
    assert (mm.loc[[2, 4, 8], "mean_abs_error"] < 1e-3).all()
