"""Experiment 11 (robust_training) and how results tell RobustLoss models apart.

The results folders here are synthetic (config.json with a checkpoint's metadata + Parquet rows
written with probust.run.store's schema): the p values are chosen so that medians, gains and the
matched-accuracy interpolation can be computed by hand with numpy. The last test runs the
experiment on the digits results of :func:`tests._helpers.build_results`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from probust import experiments
from probust.experiments.runs import Results
from probust.run.store import make_table
from tests._helpers import MAIN_POINTS, MC_N, assert_figures, raw
from tests._helpers import SIGMAS as DIGITS_SIGMAS

SIGMAS = (0.1, 0.4)
N = 41
RECIPE = {
    "dataset": "fashion-mnist",
    "arch": "cnn",
    "epochs": 1,
    "lr": 0.05,
    "batch_size": 128,
    "weight_decay": 5e-4,
    "schedule": "cosine",
    "train_size": 60000,
    "seed": 0,
}


def robust_meta(mu: float, sigma: float) -> dict:
    return {
        "extra_loss": f"RobustLoss(sigma={sigma}, mu={mu:g}, cdf='mv-sigmoid', linearisation='taylor', target='label', max_points=32, min_p=0.0001, warmup_steps=100)",
        "extra_loss_config": {
            "name": "RobustLoss",
            "mu": mu,
            "sigma": sigma,
            "cdf": "mv-sigmoid",
            "max_points": 32,
            "warmup_steps": 100,
        },
    }


def write_run(
    root: Path,
    name: str,
    p: dict[float, np.ndarray],
    *,
    accuracy: float,
    grad_reg: float = 0.0,
    extra: dict | None = None,
    recipe: dict | None = None,
) -> Path:
    """A results folder with Monte Carlo rows ``p[sigma]`` (one per point) for a model with this metadata."""
    folder = root / name
    folder.mkdir(parents=True)
    meta = {
        **RECIPE,
        **(recipe or {}),
        "grad_reg": grad_reg,
        "test_accuracy": accuracy,
        "extra_loss": None,
        **(extra or {}),
    }
    config = {
        "format": "probust.results",
        "run": {"dataset": "fashion-mnist", "split": "test", "seed": 0},
        "model": {"meta": meta},
    }
    (folder / "config.json").write_text(json.dumps(config))
    cols: dict[str, list] = {
        c: []
        for c in (
            "index",
            "label",
            "prediction",
            "target",
            "sigma",
            "method",
            "n_samples",
            "p",
            "ci_low",
            "ci_high",
            "stderr",
            "clean_softmax",
            "cdf_error",
            "seconds",
            "seed",
        )
    }
    for sigma, values in p.items():
        for i, v in enumerate(values):
            row = dict(
                index=i,
                label=i % 10,
                prediction=i % 10,
                target=i % 10,
                sigma=sigma,
                method="mc",
                n_samples=1000,
                p=float(v),
                ci_low=max(0.0, v - 0.03),
                ci_high=min(1.0, v + 0.03),
                stderr=0.015,
                clean_softmax=0.9,
                cdf_error=np.nan,
                seconds=1e-3,
                seed=0,
            )
            for c in cols:
                cols[c].append(row[c])
    pq.write_table(make_table(cols), folder / "results.parquet")
    return folder


def values(center: float, rng: np.random.Generator) -> np.ndarray:
    """N values in [0, 1] whose median is exactly ``center`` (an odd count, center among them)."""
    lo = rng.uniform(0.0, center, N // 2)
    hi = rng.uniform(center, 1.0, N // 2)
    return rng.permutation(np.concatenate([lo, [center], hi]))


# (name, grad_reg, accuracy, median at sigma 0.1, median at sigma 0.4, robust (mu, sigma) or None)
MODELS = [
    ("plain", 0.0, 0.85, 0.95, 0.70, None),
    ("gn-0.01", 0.01, 0.86, 0.96, 0.74, None),
    ("gn-0.1", 0.1, 0.83, 0.97, 0.86, None),
    ("robust-1", 0.0, 0.84, 0.965, 0.82, (1.0, 0.4)),
]


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory) -> tuple[Results, dict]:
    root = tmp_path_factory.mktemp("robust-training")
    rng = np.random.default_rng(5)
    raw = {}
    for name, lam, acc, m1, m4, robust in MODELS:
        p = {0.1: values(m1, rng), 0.4: values(m4, rng)}
        raw[name] = p
        write_run(root, name, p, accuracy=acc, grad_reg=lam, extra=robust_meta(*robust) if robust else None)
    return experiments.load_results(root), raw


def test_robust_loss_models_are_neither_standard_nor_in_the_gradient_norm_family(synthetic):
    results, _ = synthetic
    robust = results.by_label("Fashion-MNIST CNN, robust μ=1 (σ=0.4)")
    assert robust.robust_loss == 1.0 and robust.robust_sigma == 0.4 and not robust.is_standard
    assert [r.label for r in results.standard()] == ["Fashion-MNIST CNN"]
    assert [[r.label for r in f] for f in results.families()] == [
        ["Fashion-MNIST CNN", "Fashion-MNIST CNN, λ=0.01", "Fashion-MNIST CNN, λ=0.1"]
    ]
    assert results.primary().label == "Fashion-MNIST CNN"
    assert results.robust_loss_runs() == [robust] and results.runs[-1] is robust  # sorted after the family


def test_table_gives_medians_gains_and_accuracy_costs_from_the_rows(synthetic, tmp_path):
    results, raw = synthetic
    out = experiments.run("robust_training", results, tmp_path)
    assert out.skipped is None, out.skipped
    t = out.table
    assert len(t) == len(MODELS) * len(SIGMAS) and set(t["kind"]) == {"plain", "grad-norm", "robust-loss"}
    by_name = {
        "Fashion-MNIST CNN": "plain",
        "Fashion-MNIST CNN, λ=0.01": "gn-0.01",
        "Fashion-MNIST CNN, λ=0.1": "gn-0.1",
        "Fashion-MNIST CNN, robust μ=1 (σ=0.4)": "robust-1",
    }
    acc = {name: a for name, _, a, *_ in MODELS}
    for row in t.itertuples():
        p, p_plain = raw[by_name[row.model]][row.sigma], raw["plain"][row.sigma]
        assert row.n_points == N and row.mc_n == 1000
        assert row.median_p == pytest.approx(np.median(p)) and row.mean_p == pytest.approx(p.mean())
        assert row.gain_median == pytest.approx(np.median(p) - np.median(p_plain))
        assert row.gain_mean == pytest.approx(p.mean() - p_plain.mean())
        assert row.accuracy_cost == pytest.approx(acc["plain"] - acc[by_name[row.model]])
        assert row.median_ci_low <= row.median_p <= row.median_ci_high
        assert row.gain_ci_low <= row.gain_median + 1e-12 and row.gain_median <= row.gain_ci_high + 1e-12
    # the bootstrap is seeded: the same call gives the same intervals
    again = experiments.run("robust_training", results, tmp_path / "again").table
    pd.testing.assert_frame_equal(t, again)


def test_matched_accuracy_interpolates_the_family_over_accuracy(synthetic, tmp_path):
    results, raw = synthetic
    out = experiments.run("robust_training", results, tmp_path)
    m = out.tables["matched"].set_index("sigma")
    assert list(m.index) == list(SIGMAS)
    for sigma in SIGMAS:
        family = [("gn-0.1", 0.83), ("plain", 0.85), ("gn-0.01", 0.86)]  # sorted by accuracy
        points = [(n, a, np.median(raw[n][sigma])) for n, a in family]
        # the frontier: members no other member beats on both accuracy and median
        front = [
            (n, a, p)
            for n, a, p in points
            if not any(a2 >= a and p2 >= p and (a2 > a or p2 > p) for _, a2, p2 in points)
        ]
        expected = np.interp(0.84, [a for _, a, _ in front], [p for *_, p in front])  # clamps below the frontier
        row = m.loc[sigma]
        assert row["in_range"] and row["matched_median_p"] == pytest.approx(expected)
        below = [n for n, a, _ in front if a <= 0.84]
        above = [n for n, a, _ in front if a > 0.84]
        short = {"gn-0.1": "λ=0.1", "plain": "plain", "gn-0.01": "λ=0.01"}
        names = [below[-1], above[0]] if below else [above[0]]
        assert row["matched_between"] == " and ".join(short[n] for n in names)
        assert row["advantage"] == pytest.approx(np.median(raw["robust-1"][sigma]) - expected)
        assert row["advantage_ci_low"] <= row["advantage"] <= row["advantage_ci_high"]
        # nearest in accuracy: plain (0.85) and λ=0.1 (0.83) are both 0.01 away; the regularised one wins the tie
        assert row["nearest_short"] == "λ=0.1" and row["nearest_accuracy"] == 0.83
    # λ=0.1 is less accurate than the robust model, λ=0.01 less robust: nothing dominates it at σ=0.4
    assert m.loc[0.4, "dominated_by"] == "" and m.loc[0.4, "dominates"] == ""
    # at σ=0.1 λ=0.01 is more accurate (0.86); whether it is also more robust depends on the drawn values
    med = {n: np.median(raw[n][0.1]) for n in ("gn-0.01", "robust-1")}
    assert (m.loc[0.1, "dominated_by"] == "λ=0.01") == (med["gn-0.01"] >= med["robust-1"])


def test_figure_and_reading_state_the_comparison(synthetic, tmp_path):
    results, raw = synthetic
    out = experiments.run("robust_training", results, tmp_path)
    assert len(out.figures) == 1
    png = out.figures[0]
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and png.stat().st_size > 5_000
    assert b"<svg" in png.with_suffix(".svg").read_bytes()[:2000]
    assert {f.name for f in out.files} >= {
        "robust_training.csv",
        "robust_training_matched.csv",
        "robust_training.png",
        "robust_training.svg",
    }
    first = out.reading[0]
    # the headline is at the sigma the model was trained for, with the numbers of the tables
    m = out.tables["matched"].set_index("sigma").loc[0.4]
    assert first.startswith("At σ = 0.4, RobustLoss μ=1 (σ=0.4) raises the median")
    assert f"from {np.median(raw['plain'][0.4]):.3g} (plain) to {np.median(raw['robust-1'][0.4]):.3g}" in first
    assert "at a cost of 1.0 accuracy point " in first
    assert f"reaches {m['matched_median_p']:.3g} (interpolated between {m['matched_between']})" in first
    verdict = {
        "robust loss higher": "the robust loss is ahead",
        "gradient-norm higher": "gradient-norm regularisation is ahead",
        "no clear difference": "no clear difference",
    }[m["verdict"]]
    assert verdict in first
    assert any(s.startswith("Over all σ, RobustLoss μ=1 (σ=0.4) is") for s in out.reading)


def test_a_robust_model_outside_the_familys_accuracy_range_gets_the_nearest_member(tmp_path):
    rng = np.random.default_rng(1)
    write_run(tmp_path, "plain", {0.2: values(0.8, rng)}, accuracy=0.85)
    write_run(tmp_path, "gn", {0.2: values(0.9, rng)}, accuracy=0.84, grad_reg=0.1)
    write_run(tmp_path, "robust", {0.2: values(0.85, rng)}, accuracy=0.87, extra=robust_meta(0.5, 0.2))
    out = experiments.run("robust_training", experiments.load_results(tmp_path), tmp_path / "out")
    row = out.tables["matched"].iloc[0]
    assert (
        not row["in_range"]
        and np.isnan(row["matched_median_p"])
        and row["verdict"] == "outside the family's accuracy range"
    )
    assert row["nearest_short"] == "plain" and row["nearest_accuracy"] == 0.85
    assert "while gaining 2.0 accuracy points" in out.reading[0]
    assert "lies above the range of the gradient-norm family (84.0% to 85.0%)" in out.reading[0]
    assert "the nearest in accuracy, plain (85.0%)" in out.reading[0]
    # more accurate and more robust than plain, less robust than λ=0.1
    assert row["dominates"] == "plain" and not row["dominates_all"] and row["dominated_by"] == ""
    assert "It is at least as accurate and at least as robust (median) as plain." in out.reading[0]


def test_skipped_with_a_reason_when_a_piece_is_missing(tmp_path):
    rng = np.random.default_rng(2)
    write_run(tmp_path / "a", "plain", {0.2: values(0.8, rng)}, accuracy=0.85)
    write_run(tmp_path / "a", "gn", {0.2: values(0.9, rng)}, accuracy=0.84, grad_reg=0.1)
    out = experiments.run("robust_training", experiments.load_results(tmp_path / "a"), tmp_path / "out")
    assert out.skipped and "--robust-loss" in out.skipped and not out.figures
    # a robust model, but no gradient-norm model trained with its recipe
    write_run(tmp_path / "b", "plain", {0.2: values(0.8, rng)}, accuracy=0.85)
    write_run(tmp_path / "b", "robust", {0.2: values(0.9, rng)}, accuracy=0.84, extra=robust_meta(1.0, 0.2))
    write_run(tmp_path / "b", "gn-other", {0.2: values(0.9, rng)}, accuracy=0.84, grad_reg=0.1, recipe={"epochs": 3})
    out = experiments.run("robust_training", experiments.load_results(tmp_path / "b"), tmp_path / "out")
    assert out.skipped and "gradient-norm models" in out.skipped and "robust μ=1" in out.skipped
    # everything there, but no sigma in common
    write_run(tmp_path / "c", "plain", {0.2: values(0.8, rng)}, accuracy=0.85)
    write_run(tmp_path / "c", "gn", {0.2: values(0.9, rng)}, accuracy=0.84, grad_reg=0.1)
    write_run(tmp_path / "c", "robust", {0.3: values(0.9, rng)}, accuracy=0.84, extra=robust_meta(1.0, 0.3))
    out = experiments.run("robust_training", experiments.load_results(tmp_path / "c"), tmp_path / "out")
    assert out.skipped and "share no σ" in out.skipped


def test_robust_training_compares_the_robust_loss_model_with_the_family_it_was_trained_like(results, out_dir):
    out = experiments.run("robust_training", results, out_dir)
    assert_figures(out)
    t = out.table
    assert list(dict.fromkeys(t["model"])) == [
        "digits linear",
        "digits linear, λ=0.05",
        "digits linear, robust μ=1 (σ=0.3)",
    ]
    assert (
        list(t["kind"].unique()) == ["plain", "grad-norm", "robust-loss"]
        and sorted(t["sigma"].unique()) == DIGITS_SIGMAS
    )
    for row in t.itertuples():
        p = raw(results, row.model)
        p = p[(p.method == "mc") & (p.sigma == row.sigma) & (p.n_samples == MC_N)]["p"].to_numpy()
        assert (
            row.n_points == MAIN_POINTS
            and row.median_p == pytest.approx(np.median(p))
            and row.mean_p == pytest.approx(p.mean())
        )
    m = out.tables["matched"]
    assert len(m) == len(DIGITS_SIGMAS) and set(m["model"]) == {"digits linear, robust μ=1 (σ=0.3)"}
    assert out.reading[0].startswith("At σ = 0.3, RobustLoss μ=1 (σ=0.3)")
