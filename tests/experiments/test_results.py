"""probust.experiments.runs and run_info: reading results folders (on the digits results)."""

from __future__ import annotations

import numpy as np

from probust import experiments
from tests._helpers import CONV_MC, MAIN_POINTS, MC_N, MMSE_N, POOL_POINTS, SIGMAS


def test_load_results_finds_every_run_and_names_them_from_the_checkpoint(results, results_dir):
    assert [r.label for r in results] == [
        "digits linear",
        "digits linear, λ=0.05",
        "digits linear, robust μ=1 (σ=0.3)",
        "digits CNN",
    ]
    folders = sorted((results_dir / "results").iterdir())
    certify = [f for f in folders if f.name.startswith("certify-")]
    assert len(certify) == 1  # a probust certify folder: found only when its format is asked for
    assert experiments.find_runs(results_dir) == [f for f in folders if f not in certify]
    assert experiments.find_runs(results_dir, format="probust.certify") == certify
    assert [[r.label for r in f] for f in results.families()] == [["digits linear", "digits linear, λ=0.05"]]
    assert results.primary().label in ("digits linear", "digits CNN")  # standard, with the pool
    lin = results.by_label("digits linear")
    assert lin.principal_n("mc") == MC_N and lin.principal_n("mmse") == MMSE_N
    assert list(lin.core_indices) == list(range(MAIN_POINTS))
    assert lin.sample_counts("mc") == sorted(set(CONV_MC + [MC_N]))


def test_wide_table_has_one_row_per_point_and_sigma_at_the_principal_counts(results):
    run = results.by_label("digits CNN")
    w = run.wide(core=True)
    assert len(w) == MAIN_POINTS * len(SIGMAS)
    t = run.table
    mc = t[(t.method == "mc") & (t.n_samples == MC_N)].set_index(["index", "sigma"])["p"]
    np.testing.assert_array_equal(
        w.set_index(["index", "sigma"])["p_mc"].to_numpy(), mc.loc[w.set_index(["index", "sigma"]).index].to_numpy()
    )
    soft = t[t.method == "softmax"].drop_duplicates("index").set_index("index")["p"]
    np.testing.assert_allclose(w["softmax"], soft.loc[w["index"]].to_numpy())
    # the pool of points scored at one sigma only is in the full table, not in the core one
    assert run.wide()["index"].nunique() == POOL_POINTS
