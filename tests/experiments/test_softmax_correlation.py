"""Experiment 5 (softmax_correlation), checked against scipy.stats."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from probust import experiments
from tests._helpers import MAIN_POINTS, SIGMAS, assert_figures


def test_softmax_correlations_match_scipy(results, out_dir):
    out = experiments.run("softmax_correlation", results, out_dir)
    assert_figures(out)
    t = out.table
    assert set(t["p_robust"]) == {"mmse", "mc"}
    assert len(t) == 3 * len(SIGMAS) * 2 + len(SIGMAS)  # the robust-loss model has mc only
    for row in t.itertuples():
        run = results.by_label(row.model)
        w = run.wide(core=True)
        g = w[w.sigma == row.sigma]
        assert row.n_points == MAIN_POINTS
        assert row.pearson == pytest.approx(stats.pearsonr(g.softmax, g[f"p_{row.p_robust}"]).statistic, abs=1e-10)
        assert row.spearman == pytest.approx(stats.spearmanr(g.softmax, g[f"p_{row.p_robust}"]).statistic, abs=1e-10)
    assert out.settings["family"] == ["digits linear", "digits linear, λ=0.05"]


def test_spearman_handles_ties_like_scipy():
    from probust.experiments.softmax_correlation import pearson, spearman

    a = np.array([1.0, 1.0, 1.0, 0.5, 0.2, 0.2, 0.9])
    b = np.array([0.3, 0.1, 0.3, 0.2, 0.2, 0.05, 0.7])
    assert spearman(a, b) == pytest.approx(stats.spearmanr(a, b).statistic)
    assert pearson(a, b) == pytest.approx(stats.pearsonr(a, b).statistic)
    assert np.isnan(pearson(np.ones(5), np.arange(5.0)))
