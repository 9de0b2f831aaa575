"""Experiment 3 (runtime)."""

from __future__ import annotations

import numpy as np
import pytest

from probust import experiments
from tests._helpers import assert_figures


def test_runtime_times_every_estimator_serial_and_batched(results, out_dir):
    out = experiments.run("runtime", results, out_dir, points=2, mc_counts=[50, 200], mmse_counts=[1, 3])
    assert_figures(out)
    t = out.table
    assert len(t) == (2 + 1 + 2 + 1 + 2 + 1) * 2
    assert set(t["mode"]) == {"serial", "batched"} and (t["points"] == 2).all() and (t["seconds"] > 0).all()
    ref = t[(t.method == "mc") & (t.n_samples == 200)]
    assert np.allclose(ref["speedup_vs_mc"], 1.0)
    for row in t.itertuples():
        mc = t[(t.method == "mc") & (t.n_samples == 200) & (t["mode"] == row.mode)]["seconds"].iloc[0]
        assert row.speedup_vs_mc == pytest.approx(mc / row.seconds)
    paper = out.tables["paper_layout"]
    assert list(paper.columns) == [
        "method",
        "n_samples",
        "peak_mb_batched",
        "peak_mb_serial",
        "seconds_batched",
        "seconds_serial",
        "speedup_vs_mc_batched",
        "speedup_vs_mc_serial",
    ]
    # Peak memory is measured per call: every estimator allocates something, and a batched
    # Monte Carlo call over 2 points x 200 draws of 8x8 inputs holds far less than a gigabyte.
    assert (t["peak_mb"] >= 0).all() and (t["peak_mb"] < 1024).all()
