"""Experiment 8 (vulnerable_points)."""

from __future__ import annotations

import numpy as np

from probust import experiments
from tests._helpers import POOL_POINTS, assert_figures


def test_vulnerable_points_selects_the_extremes_of_each_class(results, out_dir):
    out = experiments.run("vulnerable_points", results, out_dir, k=3)
    assert_figures(out)
    assert len(out.figures) == 2  # the grid and the noisy examples
    sel = out.table
    run = results.by_label(out.settings["model"])
    assert out.settings["sigma"] == 0.3 and out.settings["pool_points"] == POOL_POINTS
    w = run.wide()
    pool = w[(w.sigma == 0.3) & w.p_mmse.notna()]
    for c, g in pool.groupby("label"):
        for score, col in (("mmse", "p_mmse"), ("softmax", "softmax")):
            low = sel[(sel["class"] == c) & (sel.score == score) & (sel.end == "lowest")]
            high = sel[(sel["class"] == c) & (sel.score == score) & (sel.end == "highest")]
            assert len(low) == len(high) == 3
            assert np.allclose(sorted(low[col]), sorted(g[col].nsmallest(3)))
            assert np.allclose(sorted(high[col]), sorted(g[col].nlargest(3)))
