"""probust.plots: each figure draws the frame's own numbers, checked against pandas computations."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.figure import Figure

import probust
from probust import plots
from probust.errors import OptionError

SIGMAS = (0.1, 0.2)
N = 30


@pytest.fixture(scope="module")
def frame() -> pd.DataFrame:
    """The runner's columns for 30 points of 3 classes: mc (n=100, with intervals) and mmse (N=5)
    at two sigmas, softmax, and mmse at N=1 on a few points (not its principal count)."""
    rng = np.random.default_rng(0)
    rows = []
    labels = np.arange(N) % 3
    predictions = labels.copy()
    predictions[[4, 11]] = (labels[[4, 11]] + 1) % 3  # two misclassified points
    for s in SIGMAS:
        for i in range(N):
            base = {"index": i, "label": labels[i], "prediction": predictions[i], "target": predictions[i], "sigma": s}
            p_mc = float(rng.uniform(0.05, 0.95))
            rows.append(
                {**base, "method": "mc", "n_samples": 100, "p": p_mc, "ci_low": p_mc - 0.05, "ci_high": p_mc + 0.05}
            )
            rows.append(
                {
                    **base,
                    "method": "mmse",
                    "n_samples": 5,
                    "p": float(rng.uniform()),
                    "ci_low": np.nan,
                    "ci_high": np.nan,
                }
            )
            rows.append(
                {**base, "method": "softmax", "n_samples": 0, "p": 0.5 + i / 100, "ci_low": np.nan, "ci_high": np.nan}
            )
            if i < 4:
                rows.append({**base, "method": "mmse", "n_samples": 1, "p": 2.0, "ci_low": np.nan, "ci_high": np.nan})
    return pd.DataFrame(rows)


def principal_rows(frame: pd.DataFrame) -> pd.DataFrame:
    # the rows the figures must use: mmse at N=5 (30 rows per sigma beat N=1's 4), every other as is
    return frame[~((frame["method"] == "mmse") & (frame["n_samples"] == 1))]


def test_extremes_shows_the_true_lowest_and_highest_points_of_each_class(frame):
    # each image is constant, of value index / N, so a mosaic cell says which input it shows
    data = torch.arange(N, dtype=torch.float32).div(N).reshape(N, 1, 1, 1).expand(N, 1, 4, 4).clone()
    k = 3
    fig = plots.extremes(frame, data, k=k, method="mmse", sigma=0.2, class_names=["a", "b", "c"])
    assert isinstance(fig, Figure)
    rows = principal_rows(frame)
    rows = rows[(rows["method"] == "mmse") & (rows["sigma"] == 0.2)]
    h, gap, caption = 4, 1, 3  # 4x4 images: gap max(1, 4 // 8), caption max(3, round(4 * 0.42))
    for panel, end in enumerate(("lowest", "highest")):
        picture = np.ma.filled(fig.axes[panel].images[0].get_array(), np.nan)
        for c in range(3):
            group = rows[rows["label"] == c]
            expected = group.nsmallest(k, "p") if end == "lowest" else group.nlargest(k, "p")
            for j, index in enumerate(expected["index"]):
                cell = picture[c * (h + caption), j * (h + gap)]
                assert cell == pytest.approx(index / N), (end, c, j)
    captions = [t.get_text() for t in fig.axes[0].texts]
    lowest0 = rows[rows["label"] == 0].nsmallest(k, "p")
    assert captions[:k] == [f"{p:.2f}" + ("*" if i in (4, 11) else "") for i, p in zip(lowest0["index"], lowest0["p"])]


def test_extremes_table_marks_misclassified_points_and_breaks_ties_by_index():
    df = pd.DataFrame(
        {
            "index": [5, 2, 9, 7],
            "label": 0,
            "prediction": [0, 1, 0, 0],
            "sigma": 0.1,
            "method": "mc",
            "p": [0.5, 0.5, 0.9, 0.1],
        }
    )
    t = plots.extremes_table(df, k=2)
    assert t[t["end"] == "lowest"]["index"].tolist() == [7, 2]  # 0.1, then 0.5 at the lower index
    assert t[t["end"] == "highest"]["index"].tolist() == [9, 2]
    assert t.attrs == {"method": "mc", "sigma": 0.1, "by": "label"}


def test_class_bias_bars_are_the_group_means_of_the_principal_rows(frame):
    fig = plots.class_bias(frame, kind="mean", sigma=0.1, methods=["mc", "mmse"])
    ax = fig.axes[0]
    heights = [p.get_height() for p in ax.patches]
    rows = principal_rows(frame)
    rows = rows[rows["sigma"] == 0.1]
    expected = [rows[(rows["method"] == m)].groupby("label")["p"].mean().tolist() for m in ("mc", "mmse")]
    np.testing.assert_allclose(heights, expected[0] + expected[1])
    table = plots.class_means(frame, sigma=0.1, methods="mc")
    sem = rows[rows["method"] == "mc"].groupby("label")["p"].sem().to_numpy()
    np.testing.assert_allclose(table["ci_high"] - table["mean"], 1.959963984540054 * sem)


def test_class_bias_boxes_mark_each_class_mean(frame):
    fig = plots.class_bias(frame, methods="mmse")
    rows = principal_rows(frame)
    for ax, s in zip(fig.axes, SIGMAS):
        means = [line.get_ydata()[0] for line in ax.lines if line.get_marker() == "D"]
        expected = rows[(rows["method"] == "mmse") & (rows["sigma"] == s)].groupby("label")["p"].mean()
        np.testing.assert_allclose(means, expected.to_numpy())


def test_against_monte_carlo_scatters_each_point_at_its_two_estimates(frame):
    fig = plots.against_monte_carlo(frame, methods=["mmse", "softmax"])
    assert len(fig.axes) == 4  # 2 methods x 2 sigmas
    rows = principal_rows(frame)
    for ax, (method, s) in zip(fig.axes, [(m, s) for m in ("mmse", "softmax") for s in SIGMAS]):
        (points,) = [c for c in ax.collections if isinstance(c, PathCollection)]
        mc = rows[(rows["method"] == "mc") & (rows["sigma"] == s)].set_index("index")["p"]
        other = rows[(rows["method"] == method) & (rows["sigma"] == s)].set_index("index")["p"]
        expected = np.column_stack([mc.sort_index(), other.sort_index()])
        np.testing.assert_allclose(points.get_offsets(), expected)
        assert f"{np.abs(other.sort_index() - mc.sort_index()).mean():.3g}" in ax.get_title()
        # Monte Carlo's interval as horizontal bars: from ci_low to ci_high
        (bars,) = [c for c in ax.collections if isinstance(c, LineCollection)]
        segments = np.array([seg[:, 0] for seg in bars.get_segments()])
        np.testing.assert_allclose(segments, np.column_stack([mc.sort_index() - 0.05, mc.sort_index() + 0.05]))


def test_over_sigma_marks_each_distribution_mean(frame):
    fig = plots.over_sigma(frame, methods=["mc", "mmse"])
    ax = fig.axes[0]
    means = [line.get_ydata()[0] for line in ax.lines if line.get_marker() == "D"]
    rows = principal_rows(frame)
    expected = [rows[(rows["method"] == m) & (rows["sigma"] == s)]["p"].mean() for m in ("mc", "mmse") for s in SIGMAS]
    np.testing.assert_allclose(means, expected)
    violin = plots.over_sigma(frame, methods="mc", kind="violin", sigma=0.2).axes[0]
    medians = [c for c in violin.collections if isinstance(c, LineCollection)][-1]
    assert medians.get_segments()[0][0, 1] == pytest.approx(
        rows[(rows["method"] == "mc") & (rows["sigma"] == 0.2)]["p"].median()
    )


def test_an_estimate_is_plotted_by_its_target_class():
    est = probust.Estimate(
        p=torch.tensor([0.2, 0.4, 0.9, 0.7], dtype=torch.float64), target=torch.tensor([0, 0, 1, 1]), method="mmse"
    )
    fig = plots.class_bias(est, kind="mean")
    np.testing.assert_allclose([p.get_height() for p in fig.axes[0].patches], [0.3, 0.8])
    assert "target" in fig.axes[0].get_xlabel()
    data = torch.rand(4, 3, 5, 5)
    assert plots.extremes_table(est, k=1)["index"].tolist() == [0, 1, 3, 2]
    assert isinstance(plots.extremes(est, data, k=1), Figure)


def test_figures_stay_out_of_pyplot(frame):
    import matplotlib.pyplot as plt

    before = plt.get_fignums()
    plots.over_sigma(frame)
    assert plt.get_fignums() == before


@pytest.mark.parametrize(
    ("call", "field", "words"),
    [
        (lambda f: plots.against_monte_carlo(f[f["method"] != "mc"]), "results", "no Monte Carlo"),
        (lambda f: plots.against_monte_carlo(f, methods="mc"), "methods", "besides 'mc'"),
        (lambda f: plots.over_sigma(f, sigma=0.3), "sigma", "present: 0.1, 0.2"),
        (lambda f: plots.class_bias(f, methods=["taylor"]), "methods", "'taylor'"),
        (lambda f: plots.extremes(f, torch.zeros(N, 1, 2, 2), method="taylor"), "method", "'taylor'"),
        (lambda f: plots.extremes(f, torch.zeros(N, 1, 2, 2), k=0), "k", "positive"),
        (lambda f: plots.extremes(f, torch.zeros(3, 1, 2, 2)), "data", "no input at index"),
        (lambda f: plots.class_bias(f, kind="violin"), "kind", "'box' or 'mean'"),
        (lambda f: plots.class_bias(f, by="truth"), "by", "no 'truth' column"),
        (lambda f: plots.class_bias(f, ax=Figure().subplots()), "ax", "one sigma"),
        (lambda f: plots.over_sigma(f.drop(columns="p")), "results", "no column 'p'"),
        (lambda f: plots.over_sigma(f.to_dict()), "results", "DataFrame"),
    ],
)
def test_missing_rows_or_bad_arguments_are_named(frame, call, field, words):
    with pytest.raises(OptionError) as info:
        call(frame)
    assert info.value.field == field and words in str(info.value)
