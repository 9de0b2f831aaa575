"""Experiment 9 (case_study)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from probust import experiments
from tests._helpers import assert_figures


def test_case_study_groups_take_top_and_bottom_k_per_class():
    from probust.experiments.case_study import groups, split

    rng = np.random.default_rng(0)
    points = pd.DataFrame(
        {"index": np.arange(90), "label": np.repeat([0, 1, 2], 30), "p_mmse": rng.random(90), "softmax": rng.random(90)}
    )
    g = groups(points, "mmse", 5)
    assert len(g) == 30 and g["target"].sum() == 15
    for c, h in g.groupby("label"):
        assert h[h.target == 1]["value"].min() > h[h.target == 0]["value"].max()
        assert sorted(h[h.target == 1]["value"]) == sorted(points[points.label == c]["p_mmse"].nlargest(5))
    train, test = split(g["target"].to_numpy(), 0.1, np.random.default_rng(1))
    assert len(set(train) & set(test)) == 0 and len(train) + len(test) == 30
    assert g["target"].to_numpy()[test].sum() == len(test) / 2  # stratified


def test_case_study_trains_and_tests_both_classifiers_over_seeds(results, out_dir):
    out = experiments.run("case_study", results, out_dir, k=5, seeds=2, epochs=2)
    assert_figures(out)
    s = out.table
    assert list(s["score"]) == ["mmse", "softmax"] and (s["seeds"] == 2).all()
    seeds = out.tables["seeds"]
    assert len(seeds) == 4
    # Oracle for the accuracies: seed 0 of p^mmse recomputed from the public pieces (the pool of
    # scored points, the top/bottom-k groups, the seeded split, the training), not just a number in [0, 1].
    from probust.experiments.case_study import groups, split, train_and_test
    from probust.experiments.common import case_sigma, pool
    from probust.experiments.datasets import images, load_dataset

    run = results.primary()
    g = groups(pool(run, case_sigma(run)), "mmse", 5)
    ds = load_dataset(run)
    x, y = images(ds, g["index"].to_numpy()).astype(np.float32), g["target"].to_numpy().astype(np.int64)
    tr, te = split(y, 0.1, np.random.default_rng([run.seed, 0]))
    expect = train_and_test(x, y, tr, te, seed=run.seed * 1000, epochs=2, mean=list(ds.mean), std=list(ds.std))
    first = seeds[(seeds.score == "mmse") & (seeds.seed == 0)].iloc[0]
    assert first["test_accuracy"] == expect["test_accuracy"] and first["n_test"] == len(te)
    assert (seeds["images"] == 10 * 2 * 5).all() and (seeds["n_test"] == 10).all()
    np.testing.assert_allclose(
        s.set_index("score")["mean_accuracy"], seeds.groupby("score")["test_accuracy"].mean().loc[["mmse", "softmax"]]
    )
    from probust.models import build

    assert out.settings["cnn_parameters"] == sum(p.numel() for p in build("cnn", 2, (1, 8, 8)).parameters())
