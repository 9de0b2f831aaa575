"""Experiment 4 (mv_sigmoid)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from probust import experiments
from tests._helpers import MAIN_POINTS, SIGMAS, assert_figures


def test_mv_sigmoid_pairs_share_z_and_statistics_match_scipy(results, out_dir):
    out = experiments.run("mv_sigmoid", results, out_dir)
    assert_figures(out)
    pairs = out.tables["points"]
    t = out.table
    assert len(t) == 3 * len(SIGMAS) * 2  # models x sigmas x (taylor, mmse) pairs
    for row in t.itertuples():
        g = pairs[(pairs.model == row.model) & (pairs.linearisation == row.linearisation) & (pairs.sigma == row.sigma)]
        assert len(g) == MAIN_POINTS
        assert row.mean_abs_diff == pytest.approx(np.abs(g.mv_sigmoid - g.mvn_cdf).mean())
        assert row.pearson_r == pytest.approx(stats.pearsonr(g.mvn_cdf, g.mv_sigmoid).statistic, abs=1e-10)
    # the maps applied to the same z: for the linear model Taylor and MMSE give the same z
    lin = pairs[pairs.model == "digits linear"].pivot_table(
        index=["index", "sigma"], columns="linearisation", values="mv_sigmoid"
    )
    np.testing.assert_allclose(lin["taylor"], lin["mmse"], atol=1e-5)


def test_mv_sigmoid_is_the_closed_form_of_the_rows_z():
    # the experiment's premise: mv-sigmoid(z) = 1 / (1 + sum exp(-z)) (checked on probust's map)
    from probust.estimators.maps import mv_sigmoid

    z = torch.tensor([[0.5, 1.0, 2.0], [3.0, -1.0, 0.0]], dtype=torch.float64)
    expected = 1 / (1 + torch.exp(-z).sum(1))
    torch.testing.assert_close(mv_sigmoid(z), expected)
