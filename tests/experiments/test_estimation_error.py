"""Experiment 1 (estimation_error), checked against a direct computation from the rows."""

from __future__ import annotations

import pytest

from probust import experiments
from tests._helpers import MAIN_POINTS, MC_N, MMSE_N, SIGMAS, assert_figures, raw


def test_estimation_error_matches_a_direct_computation_from_the_rows(results, out_dir):
    out = experiments.run("estimation_error", results, out_dir)
    assert_figures(out)
    t = out.table
    assert len(t) == 3 * len(SIGMAS) * 5  # three models with mc, two sigmas, five estimators
    assert set(t["method"]) == {"taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax"}
    for (label, sigma, method), row in t.set_index(["model", "sigma", "method"]).iterrows():
        rows = raw(results, label)
        rows = rows[(rows.sigma == sigma) & rows["index"].isin(range(MAIN_POINTS))]
        mc = rows[(rows.method == "mc") & (rows.n_samples == MC_N)].set_index("index")
        est = rows[
            (rows.method == method) & (rows.n_samples == (MMSE_N if method.startswith("mmse") else 0))
        ].set_index("index")
        err = (est["p"] - mc["p"]).abs()
        assert row["n_points"] == MAIN_POINTS
        assert row["mean_abs_error"] == pytest.approx(err.mean(), rel=1e-12)
        positive = mc["p"] > 0
        assert row["mean_rel_error"] == pytest.approx((err[positive] / mc["p"][positive]).mean(), rel=1e-12)
        inside = (est["p"] >= mc["ci_low"] - 1e-9) & (est["p"] <= mc["ci_high"] + 1e-9)
        assert row["frac_within_mc_ci"] == pytest.approx(inside.mean())
        assert row["mc_mean_half_width"] == pytest.approx(((mc["ci_high"] - mc["ci_low"]) / 2).mean())


def test_taylor_is_within_monte_carlo_noise_for_the_linear_model(results, out_dir):
    t = experiments.run("estimation_error", results, out_dir).table
    lin = t[(t.model == "digits linear") & (t.method.isin(["taylor", "mmse"]))]
    # exact estimators: the error is Monte Carlo's own, so most points lie in its 95% interval
    assert (lin["frac_within_mc_ci"] >= 0.85).all()
    assert (lin["mean_abs_error"] < lin["mc_mean_half_width"]).all()
    soft = t[(t.model == "digits linear") & (t.method == "softmax")]
    assert (soft["mean_abs_error"].to_numpy() > lin[lin.method == "taylor"]["mean_abs_error"].to_numpy()).all()
