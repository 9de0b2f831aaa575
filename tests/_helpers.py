"""probust.experiments: every experiment on small real results, checked against independent computations.

The results are made once per session by actually training tiny models on scikit-learn's digits
(a linear model at lambda 0 and 0.05, a small CNN) and scoring them with the estimators
(``build_results``); nothing is mocked. Statistics are checked against scipy.stats or numpy
computations written here from the raw rows.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
from scipy import stats

from probust import experiments
from probust.experiments import _style
from probust.experiments._results import Results

SIGMAS = [0.1, 0.3]
MAIN_POINTS = 60
POOL_POINTS = 200
PAPER = ["mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax"]
MC_N, MMSE_N = 300, 4
CONV_MC, CONV_MMSE = [100, 300, 1000], [1, 2, 4, 8]
# (name, arch, lambda, epochs, has pool and convergence rows)
MODELS = [("linear-0", "linear", 0.0, 5, True), ("linear-0.05", "linear", 0.05, 5, False), ("cnn-0", "cnn", 0.0, 8, True)]
# and the linear model trained like the family with a RobustLoss (mu, sigma), scored with mc only (experiment 11)
ROBUST = ("linear-robust", 1.0, 0.3)


def build_results(root: Path) -> Path:
    """Train the tiny models and score them (once: reused when ``root/complete`` exists)."""
    from probust.robust_loss import RobustLoss
    from probust.runner import run_estimate
    from probust.train import train

    if (root / "complete").exists():
        return root
    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        for name, arch, lam, epochs, extra in MODELS:
            ckpt = root / "models" / f"{name}.pt"
            train("digits", arch, epochs=epochs, grad_reg=lam, seed=0, out=ckpt, show_progress=False)
            kw = dict(data="digits", model=ckpt, out=root / "results" / name, device="cpu", seed=0, show_progress=False)
            run_estimate(sigmas=SIGMAS, methods=PAPER, mc_samples=MC_N, mmse_samples=MMSE_N, indices=f"0-{MAIN_POINTS - 1}", **kw)
            if extra:
                run_estimate(sigmas=[0.3], methods=["mmse", "softmax"], mmse_samples=MMSE_N, indices=f"0-{POOL_POINTS - 1}", extend=True, **kw)
                run_estimate(sigmas=[0.3], methods=["mc", "mmse"], mc_samples=CONV_MC, mmse_samples=CONV_MMSE, indices="0-5", extend=True, **kw)
        name, mu, sigma = ROBUST
        ckpt = root / "models" / f"{name}.pt"
        train("digits", "linear", epochs=5, seed=0, out=ckpt, show_progress=False, extra_loss=RobustLoss(sigma, mu, warmup_steps=20))
        run_estimate(data="digits", model=ckpt, out=root / "results" / name, device="cpu", seed=0, show_progress=False, sigmas=SIGMAS,
                     methods=["mc"], mc_samples=MC_N, indices=f"0-{MAIN_POINTS - 1}")  # fmt: skip
    finally:
        torch.set_num_threads(previous)
    (root / "complete").write_text("")
    return root


@pytest.fixture(scope="session")
def results_dir(tmp_path_factory) -> Path:
    return build_results(tmp_path_factory.getbasetemp() / "digits-results")


@pytest.fixture(scope="session")
def results(results_dir) -> Results:
    return experiments.load_results(results_dir / "results")


@pytest.fixture(scope="session")
def out_dir(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("experiments")


def raw(results: Results, label: str) -> pd.DataFrame:
    return results.by_label(label).table


def assert_figures(output) -> None:
    assert output.skipped is None, output.skipped
    assert output.figures, "no figure"
    for png in output.figures:
        assert png.suffix == ".png" and png.stat().st_size > 5_000
        assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        svg = png.with_suffix(".svg")
        assert svg.stat().st_size > 5_000 and b"<svg" in svg.read_bytes()[:2000]
    csv = [f for f in output.files if f.suffix == ".csv"]
    assert csv and all(f.stat().st_size > 0 for f in csv)
    main = pd.read_csv(csv[0])
    assert len(main) == len(output.table)


# -- loading --------------------------------------------------------------------------------------


def test_load_results_finds_every_run_and_names_them_from_the_checkpoint(results, results_dir):
    assert [r.label for r in results] == ["digits linear", "digits linear, λ=0.05", "digits linear, robust μ=1 (σ=0.3)", "digits CNN"]
    assert experiments.find_runs(results_dir) == sorted((results_dir / "results").iterdir())
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
    np.testing.assert_array_equal(w.set_index(["index", "sigma"])["p_mc"].to_numpy(), mc.loc[w.set_index(["index", "sigma"]).index].to_numpy())
    soft = t[t.method == "softmax"].drop_duplicates("index").set_index("index")["p"]
    np.testing.assert_allclose(w["softmax"], soft.loc[w["index"]].to_numpy())
    # the pool of points scored at one sigma only is in the full table, not in the core one
    assert run.wide()["index"].nunique() == POOL_POINTS


def test_unknown_experiment_names_are_refused(results, out_dir):
    with pytest.raises(ValueError, match="unknown experiment"):
        experiments.run("nope", results, out_dir)
    assert len(experiments.EXPERIMENTS) == 11
    # titles are numbered in the registry's order
    assert [experiments.describe(n)[0].split(".")[0] for n in experiments.EXPERIMENTS] == [str(i) for i in range(1, 12)]


# -- 1. estimation error ----------------------------------------------------------------------------


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
        est = rows[(rows.method == method) & (rows.n_samples == (MMSE_N if method.startswith("mmse") else 0))].set_index("index")
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


# -- 2. convergence ---------------------------------------------------------------------------------


def test_convergence_uses_the_exact_value_for_the_linear_model_and_mc_otherwise(results, out_dir):
    out = experiments.run("convergence", results, out_dir)
    assert_figures(out)
    t = out.table
    lin = t[(t.model == "digits linear") & (t.estimator == "mc")]
    assert sorted(lin["n_samples"]) == sorted(set(CONV_MC + [MC_N]))  # against the exact value, every n
    assert lin["reference"].str.startswith("exact").all()
    cnn = t[(t.model == "digits CNN") & (t.estimator == "mc")]
    assert sorted(cnn["n_samples"]) == sorted(set(CONV_MC + [MC_N]))[:-1]  # the largest n is the reference
    # recompute one row by hand: CNN, n=100 against Monte Carlo at n=1000 on the six points
    rows = raw(results, "digits CNN")
    rows = rows[(rows.sigma == 0.3) & (rows.method == "mc") & rows["index"].isin(range(6))].pivot(index="index", columns="n_samples", values="p")
    ref = rows[1000]
    expected = (rows[100] - ref).abs().mean()
    assert cnn.set_index("n_samples").loc[100, "mean_abs_error"] == pytest.approx(expected)
    theory = np.mean(np.sqrt(2 / np.pi) * np.sqrt(ref * (1 - ref) * (1 / 100 - 1 / 1000)))
    assert cnn.set_index("n_samples").loc[100, "theory_abs_error"] == pytest.approx(theory)
    mm = t[(t.model == "digits linear") & (t.estimator == "mmse")].set_index("n_samples")
    assert sorted(mm.index) == sorted(set(CONV_MMSE + [MMSE_N]))
    # centred MMSE is exact for a linear model from N = 2 on
    assert (mm.loc[[2, 4, 8], "mean_abs_error"] < 1e-3).all()


# -- 3. runtime -------------------------------------------------------------------------------------


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
        "method", "n_samples", "peak_mb_batched", "peak_mb_serial",
        "seconds_batched", "seconds_serial", "speedup_vs_mc_batched", "speedup_vs_mc_serial",
    ]  # fmt: skip
    # Peak memory is measured per call: every estimator allocates something, and a batched
    # Monte Carlo call over 2 points x 200 draws of 8x8 inputs holds far less than a gigabyte.
    assert (t["peak_mb"] >= 0).all() and (t["peak_mb"] < 1024).all()


# -- 4. mv-sigmoid ----------------------------------------------------------------------------------


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
    lin = pairs[pairs.model == "digits linear"].pivot_table(index=["index", "sigma"], columns="linearisation", values="mv_sigmoid")
    np.testing.assert_allclose(lin["taylor"], lin["mmse"], atol=1e-5)


def test_mv_sigmoid_is_the_closed_form_of_the_rows_z():
    # the experiment's premise: mv-sigmoid(z) = 1 / (1 + sum exp(-z)) (checked on probust's map)
    from probust._maps import mv_sigmoid

    z = torch.tensor([[0.5, 1.0, 2.0], [3.0, -1.0, 0.0]], dtype=torch.float64)
    expected = 1 / (1 + torch.exp(-z).sum(1))
    torch.testing.assert_close(mv_sigmoid(z), expected)


# -- 5. softmax correlation -------------------------------------------------------------------------


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


# -- 6. robust family -------------------------------------------------------------------------------


def test_robust_models_compares_the_family_members(results, out_dir):
    out = experiments.run("robust_models", results, out_dir)
    assert_figures(out)
    t = out.table
    assert set(t["model"]) == {"digits linear", "digits linear, λ=0.05"}
    assert sorted(t["grad_reg"].unique()) == [0.0, 0.05]
    assert len(t) == 2 * len(SIGMAS) * 5
    first = experiments.run("estimation_error", results, out_dir).table
    merged = t.merge(first, on=["model", "sigma", "method"], suffixes=("", "_1"))
    np.testing.assert_allclose(merged["mean_abs_error"], merged["mean_abs_error_1"])


def test_robust_models_is_skipped_without_a_family(results, out_dir):
    single = Results(root=results.root, runs=[results.by_label("digits CNN")])
    out = experiments.run("robust_models", single, out_dir / "single")
    assert out.skipped and "λ" in out.skipped and not out.figures


# -- 11. robust training ----------------------------------------------------------------------------


def test_robust_training_compares_the_robust_loss_model_with_the_family_it_was_trained_like(results, out_dir):
    out = experiments.run("robust_training", results, out_dir)
    assert_figures(out)
    t = out.table
    assert list(dict.fromkeys(t["model"])) == ["digits linear", "digits linear, λ=0.05", "digits linear, robust μ=1 (σ=0.3)"]
    assert list(t["kind"].unique()) == ["plain", "grad-norm", "robust-loss"] and sorted(t["sigma"].unique()) == SIGMAS
    for row in t.itertuples():
        p = raw(results, row.model)
        p = p[(p.method == "mc") & (p.sigma == row.sigma) & (p.n_samples == MC_N)]["p"].to_numpy()
        assert row.n_points == MAIN_POINTS and row.median_p == pytest.approx(np.median(p)) and row.mean_p == pytest.approx(p.mean())
    m = out.tables["matched"]
    assert len(m) == len(SIGMAS) and set(m["model"]) == {"digits linear, robust μ=1 (σ=0.3)"}
    assert out.reading[0].startswith("At σ = 0.3, RobustLoss μ=1 (σ=0.3)")


# -- 7. class bias ----------------------------------------------------------------------------------


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
        pc = per_class[(per_class.model == row.model) & (per_class.sigma == row.sigma) & (per_class.method == row.method)]
        np.testing.assert_allclose(pc.set_index("class")["mean"].sort_index(), means.sort_index())
        assert pc["n"].sum() == MAIN_POINTS


# -- 8. vulnerable and canonical points -------------------------------------------------------------


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


# -- 9. case study ----------------------------------------------------------------------------------


def test_case_study_groups_take_top_and_bottom_k_per_class():
    from probust.experiments.case_study import groups, split

    rng = np.random.default_rng(0)
    points = pd.DataFrame({"index": np.arange(90), "label": np.repeat([0, 1, 2], 30), "p_mmse": rng.random(90), "softmax": rng.random(90)})
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
    assert len(seeds) == 4 and seeds["test_accuracy"].between(0, 1).all()
    assert (seeds["images"] == 10 * 2 * 5).all() and (seeds["n_test"] == 10).all()
    np.testing.assert_allclose(s.set_index("score")["mean_accuracy"], seeds.groupby("score")["test_accuracy"].mean().loc[["mmse", "softmax"]])
    from probust.models import build

    assert out.settings["cnn_parameters"] == sum(p.numel() for p in build("cnn", 2, (1, 8, 8)).parameters())


# -- 10. distribution and models ----------------------------------------------------------------------


def test_distribution_quantiles_and_models_table(results, results_dir, out_dir):
    out = experiments.run("distribution", results, out_dir)
    assert_figures(out)
    t = out.table
    assert len(t) == 3 * len(SIGMAS) * 2 + len(SIGMAS)  # the robust-loss model has mc only
    for row in t.itertuples():
        w = results.by_label(row.model).wide(core=True)
        v = w[w.sigma == row.sigma][f"p_{row.method}"].to_numpy()
        assert row.mean == pytest.approx(v.mean()) and row.median == pytest.approx(np.median(v))
        assert row.q25 == pytest.approx(np.quantile(v, 0.25))
    models = out.tables["models"]
    assert list(models["model"]) == ["digits linear", "digits linear, λ=0.05", "digits linear, robust μ=1 (σ=0.3)", "digits CNN"]
    assert list(models["robust_loss_mu"].isna()) == [True, True, False, True] and models["robust_loss_sigma"].iloc[2] == 0.3
    for row in models.itertuples():
        name = {"digits linear": "linear-0", "digits linear, λ=0.05": "linear-0.05", "digits CNN": "cnn-0", "digits linear, robust μ=1 (σ=0.3)": "linear-robust"}[row.model]
        meta = json.loads((results_dir / "models" / f"{name}.pt.json").read_text())
        assert row.test_accuracy == pytest.approx(meta["test_accuracy"])
        assert row.architecture == meta["arch"] and row.dataset == "digits"


# -- all of them --------------------------------------------------------------------------------------


def test_style_names_every_paper_estimator_in_its_own_colour():
    assert set(_style.PAPER_METHODS) <= set(_style.METHOD_LABELS)
    colours = [_style.method_color(m) for m in _style.PAPER_METHODS]
    assert len(set(colours)) == len(colours)
    assert _style.METHOD_LABELS["taylor_mvs"] == r"$p^{\mathrm{taylor\_mvs}}$"
