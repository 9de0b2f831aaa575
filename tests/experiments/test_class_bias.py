"""Experiment 7 (class_bias), checked against a textbook Kruskal-Wallis computation."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from probust import experiments
from tests._helpers import MAIN_POINTS, SIGMAS, assert_figures


def kruskal_by_hand(groups: list[np.ndarray]) -> tuple[float, float]:
    """H with the tie correction, from the textbook formula (an oracle independent of scipy.stats.kruskal)."""
    values = np.concatenate(groups)
    n = values.size
    ranks = pd.Series(values).rank(method="average").to_numpy()
    h, start = 0.0, 0
    for g in groups:
        r = ranks[start : start + g.size]
        h += r.sum() ** 2 / g.size
        start += g.size
    h = 12 / (n * (n + 1)) * h - 3 * (n + 1)
    _, counts = np.unique(values, return_counts=True)
    h /= 1 - (counts**3 - counts).sum() / (n**3 - n)
    return h, float(stats.chi2.sf(h, len(groups) - 1))


def test_class_bias_statistics_and_kruskal_wallis_match_an_independent_computation(results, out_dir):
    out = experiments.run("class_bias", results, out_dir)
    assert_figures(out)
    tests_t, per_class = out.table, out.tables["per_class"]
    assert set(tests_t["model"]) == {"digits linear", "digits CNN"}  # the standard models
    assert len(tests_t) == 2 * len(SIGMAS) * 2
    for row in tests_t.itertuples():
        w = results.by_label(row.model).wide(core=True)
        g = w[w.sigma == row.sigma]
        groups = [v[f"p_{row.method}"].to_numpy() for _, v in g.groupby("label")]
        h, p = kruskal_by_hand(groups)
        assert row.kruskal_h == pytest.approx(h, rel=1e-9)
        assert row.p_value == pytest.approx(p, rel=1e-6, abs=1e-300)
        means = g.groupby("label")[f"p_{row.method}"].mean()
        names = results.by_label(row.model).classes
        assert row.least_robust_class == names[means.idxmin()] and row.most_robust_class == names[means.idxmax()]
        pc = per_class[
            (per_class.model == row.model) & (per_class.sigma == row.sigma) & (per_class.method == row.method)
        ]
        np.testing.assert_allclose(pc.set_index("class")["mean"].sort_index(), means.sort_index())
        assert pc["n"].sum() == MAIN_POINTS
