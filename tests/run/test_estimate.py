"""probust.run_estimate: the grid, per-point seeds, resumption and configuration checks."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch
from torch import nn

import probust
from probust.data import ImageDataset
from probust.run import (
    ConfigError,
    ConfigMismatchError,
    RunSettings,
    TiedPredictionError,
    execute,
    prepare,
    run_estimate,
)
from probust.run.reading import read_config, read_results
from probust.run.store import ResultStore
from tests._helpers import tiny_data, tiny_model

SIGMAS = [0.1, 0.3]
FAST = ["mc", "taylor_mvs", "mmse_mvs", "softmax"]


def arguments(out, **kwargs) -> dict:
    """run_estimate's arguments of these tests (a tiny data set and model), with ``kwargs`` changed."""
    args = dict(
        data=tiny_data(),
        model=tiny_model(),
        sigmas=SIGMAS,
        methods=FAST,
        out=out,
        mc_samples=200,
        mmse_samples=3,
        unit_size=6,
        device="cpu",
        show_progress=False,
    )
    return {**args, **kwargs}


def run(out, **kwargs):
    return run_estimate(**arguments(out, **kwargs))


def no_time(df):
    return df.drop(columns="seconds")


def test_one_row_per_point_sigma_method_and_sample_count(tmp_path):
    df = run(tmp_path / "r", mc_samples=[50, 200], limit=7)
    assert len(df) == 7 * len(SIGMAS) * (2 + 3)
    counts = df.groupby(["method", "n_samples"]).size().to_dict()
    assert counts == {("mc", 50): 14, ("mc", 200): 14, ("mmse_mvs", 3): 14, ("softmax", 0): 14, ("taylor_mvs", 0): 14}
    assert not df.duplicated(["index", "sigma", "method", "n_samples"]).any()
    mc = df[df.method == "mc"]
    assert ((mc.ci_low <= mc.p) & (mc.p <= mc.ci_high)).all() and mc.stderr.notna().all()
    assert df[df.method != "mc"][["ci_low", "ci_high", "stderr"]].isna().all().all()
    assert (df.target == df.prediction).all() and (df.seed == 0).all() and (df.seconds > 0).all()
    assert df.p.between(0, 1).all()
    # softmax's p is softmax(f(x))_t of the model itself (float64 from its float32 logits), the
    # clean prediction's confidence at temperature 1
    soft = df[df.method == "softmax"].sort_values(["sigma", "index"])
    x, _ = tiny_data().tensors()
    with torch.no_grad():
        probs = torch.softmax(tiny_model()(x[torch.as_tensor(soft["index"].to_numpy().copy())]).double(), dim=1)
    assert (soft.prediction.to_numpy() == probs.argmax(1).numpy()).all()
    expected = probs.max(1).values.numpy()
    # float32 logits of passes of other sizes round differently: measured 4.0e-9
    np.testing.assert_allclose(soft.p, expected, rtol=0, atol=1e-8)
    np.testing.assert_allclose(soft.clean_softmax, soft.p, rtol=1e-12)


def test_rows_equal_direct_estimator_calls_at_the_true_data_set_indices(tmp_path):
    # Sparse indices: each point must get the random stream of its own data-set index.
    ds, model = tiny_data(), tiny_model()
    df = run(tmp_path / "r", methods=["mc", "softmax"], indices=["2", "5-7", "15-19:2"], sigmas=[0.3])
    chosen = [2, 5, 6, 7, 15, 17, 19]
    assert sorted(set(df["index"])) == chosen
    x, labels = ds.tensors()
    for i in chosen:
        direct = probust.MonteCarlo(model, 0.3, n_samples=200)(x[i : i + 1], index_offset=i)
        row = df[(df["index"] == i) & (df.method == "mc")].iloc[0]
        assert row.p == direct.p.item() and row.ci_low == direct.ci_low.item()
        assert row.label == labels[i].item() and row.prediction == direct.target.item()


def test_table_does_not_depend_on_the_batch_size(tmp_path):
    # Not bitwise beyond Monte Carlo: this MLP's float32 passes round a row differently by how
    # many rows the pass holds (MKL's matrix products), and other work units and rows per pass
    # give other passes. So only the Monte Carlo counts are exactly equal (the softmax
    # clean_softmax column too is a clean forward pass); the rest moves by float rounding, measured
    # at most 4.5e-8 (taylor_mvs), 1.8e-8 (mmse_mvs), 4.0e-9 (softmax, clean_softmax). The same
    # --unit-size and --batch-size give the same bits for every method:
    # test_resuming_computes_only_missing_rows_and_gives_the_same_table.
    a = no_time(run(tmp_path / "a", unit_size=4, sigmas=[0.3]))
    b = no_time(run(tmp_path / "b", unit_size=7, batch_size=5, sigmas=[0.3]))
    mc = a.method == "mc"
    assert a[mc].drop(columns="clean_softmax").equals(b[mc].drop(columns="clean_softmax"))
    pd.testing.assert_frame_equal(a, b, rtol=0, atol=1e-7)


def test_every_method(tmp_path):
    df = run(tmp_path / "r", methods=list(probust.METHODS), sigmas=[0.2], limit=4)
    assert set(df.method) == set(probust.METHODS)
    sampled = df.method.str.startswith("mc")
    assert (df[sampled].n_samples == 200).all() and df[sampled][["ci_low", "ci_high", "stderr"]].notna().all().all()
    assert (df[df.method.str.startswith("mmse")].n_samples == 3).all()
    assert df[df.method.isin(["taylor", "mmse"])].cdf_error.notna().all()
    assert df[df.method.isin(["mc", "softmax", "taylor_mvs", "mmse_mvs"])].cdf_error.isna().all()


def test_the_default_methods_are_the_papers_six(tmp_path):
    df = run(tmp_path / "r", methods=probust.run.DEFAULT_METHODS, sigmas=[0.2], limit=2)
    assert sorted(set(df.method)) == sorted(["mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax"])


def test_resuming_computes_only_missing_rows_and_gives_the_same_table(tmp_path):
    # Every method, bit for bit: a resumed unit is the same call (points, plan) as the lost one.
    args = dict(
        data=tiny_data(),
        model=tiny_model(),
        sigmas=SIGMAS,
        methods=list(probust.METHODS),
        mc_samples=200,
        mmse_samples=3,
        limit=12,
        unit_size=4,
        device="cpu",
        show_progress=False,
    )
    full = run_estimate(out=tmp_path / "full", **args)
    out = tmp_path / "resumed"
    run_estimate(out=out, merge=False, **args)
    for p in sorted((out / "parts").glob("*.parquet"))[::3]:  # as if the run had died before these units
        p.unlink()
    lost = len(full) - len(read_results(out))
    assert lost > 0
    summary = execute(prepare(RunSettings(out=out, **args)))
    assert summary.rows_computed == lost and summary.rows_present == summary.rows_total - lost
    assert no_time(read_results(out)).equals(no_time(full))
    assert summary.merged is not None and not list((out / "parts").glob("*.parquet"))
    assert execute(prepare(RunSettings(out=out, **args))).rows_computed == 0  # nothing left to do


def test_a_different_configuration_is_refused_naming_what_differs(tmp_path):
    out = tmp_path / "r"
    run(out, limit=4)
    with pytest.raises(ConfigMismatchError, match=r"seed: 0 there, 1 here") as info:
        run(out, limit=4, seed=1)
    assert "use overwrite=True" in str(info.value) and "--" not in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigMismatchError, match="model_sha256"):
        run(out, limit=4, model=tiny_model(seed=1))
    with pytest.raises(ConfigMismatchError, match=r"sigmas: \[0.1, 0.3\] there, \[0.1\] here.*extend=True"):
        run(out, limit=4, sigmas=[0.1])
    with pytest.raises(ConfigMismatchError, match="n_points"):
        run(out, limit=5)
    # the order of the arguments does not make a run different
    assert len(run(out, limit=4, sigmas=SIGMAS[::-1], methods=FAST[::-1])) == 4 * 2 * 4


def test_overwrite_replaces_and_extend_adds(tmp_path):
    out = tmp_path / "r"
    run(out, limit=4)
    df = run(out, limit=3, seed=5, overwrite=True)
    assert len(df) == 3 * 2 * 4 and (df.seed == 5).all()
    extended = run(out, limit=6, seed=5, sigmas=[0.1, 0.2], extend=True)
    assert len(extended) == 3 * 2 * 4 + 6 * 2 * 4 - 3 * 1 * 4
    assert len(read_config(out)["requests"]) == 2
    with pytest.raises(ConfigMismatchError, match="seed"):
        run(out, limit=6, seed=6, extend=True)


def test_target_label_measures_the_true_class(tmp_path):
    df = run(tmp_path / "r", target="label", methods=["softmax"], sigmas=[0.1])
    assert (df.target == df.label).all()
    wrong = df[df.label != df.prediction]
    assert len(wrong) and (wrong.p < wrong.clean_softmax).all()


def test_a_plain_torch_dataset_works(tmp_path):
    ds = tiny_data()
    x, y = ds.tensors()
    plain = torch.utils.data.TensorDataset(x, y)
    a = run(tmp_path / "a", data=plain, limit=5, methods=["mc"])
    b = run(tmp_path / "b", limit=5, methods=["mc"])
    assert no_time(a).equals(no_time(b))
    assert read_config(tmp_path / "a")["run"]["dataset"] == "TensorDataset"


def test_config_records_the_run(tmp_path):
    run(tmp_path / "r", limit=5, indices="0-9")
    cfg = read_config(tmp_path / "r")
    assert cfg["run"]["model_sha256"] == probust.run.hash_state_dict(tiny_model())
    assert cfg["requests"][0]["indices"] == [[0, 5]] and cfg["requests"][0]["sigmas"] == SIGMAS
    assert cfg["probust_version"] == probust.__version__ and cfg["torch_version"] == torch.__version__
    assert cfg["device"] == "cpu" and cfg["history"][-1]["finished"] is not None
    assert read_config(tmp_path / "r" / "results.parquet")["run"] == cfg["run"]


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"methods": ["mc", "nope"]}, "unknown method 'nope'"),
        ({"sigmas": [0.1, 0]}, "positive"),
        ({"sigmas": [-1]}, "positive"),
        ({"mc_samples": 0}, "^mc_samples: "),
        ({"indices": "3-1"}, "empty range"),
        ({"indices": "25"}, "out of range"),
        ({"model": nn.Sequential(nn.Flatten(), nn.Linear(16, 4))}, "4 classes.*3"),
        ({"model": nn.Sequential(nn.Flatten(), nn.Linear(9, 3))}, "does not accept inputs of shape"),
        ({"device": "cuda:9" if torch.cuda.is_available() else "cuda"}, "^device: "),
        ({"target": "other"}, "^target: "),
        ({"sigmas": [0.1, "abc"]}, "^sigmas: 'abc' is not a number"),
        ({"batch_size": 0}, "^batch_size: "),
        ({"memory_budget": "lots"}, "^memory_budget: "),
        ({"jacobian": "magic"}, "^jacobian: "),
        ({"channels_last": "on"}, "^channels_last: "),
        ({"confidence": 1.5}, "^confidence: "),
        ({"overwrite": True, "extend": True}, "^overwrite=True and extend=True exclude each other"),
    ],
)
def test_bad_arguments_fail_before_any_work(tmp_path, kwargs, match):
    with pytest.raises(ConfigError, match=match):
        run(tmp_path / "r", **kwargs)
    assert not list(tmp_path.glob("r/parts/*.parquet"))


def test_an_unwritable_output_folder_is_refused(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ConfigError, match="cannot write"):
        run(tmp_path / "file" / "out")


def test_the_folder_lock_refuses_a_concurrent_run(tmp_path):
    out = tmp_path / "r"
    run(out, limit=2)
    holder = ResultStore(out)
    with holder.lock(), pytest.raises(ConfigError, match="another run"):
        run(out, limit=2)


NEWER = ["p_fail", "p_fail_error", "p_mc", "p_linearised", "cv_beta"]


def test_the_estimates_newer_fields_are_stored_where_the_method_has_them(tmp_path):
    methods = ["mc", "taylor", "taylor_mvs", "mmse_mvs", "softmax", "mc_cv", "mc_is"]
    df = run(tmp_path / "r", methods=methods, sigmas=[0.3], limit=4, p_fail=True)
    has = df[NEWER].notna()
    fail = df.method.isin(["taylor", "taylor_mvs", "mmse_mvs", "mc_is"])
    cv = df.method == "mc_cv"
    assert has[fail][["p_fail", "p_fail_error"]].all().all() and not has[~fail][["p_fail", "p_fail_error"]].any().any()
    assert has[cv][["p_mc", "p_linearised", "cv_beta"]].all().all()
    assert not has[~cv][["p_mc", "p_linearised", "cv_beta"]].any().any()
    # the values are the estimators' own, at the points' data-set indices
    ds, model = tiny_data(), tiny_model()
    x, _ = ds.tensors()
    rows = df.set_index(["method", "index"]).sort_index()
    direct = {
        "taylor": probust.Taylor(model, 0.3, p_fail=True)(x[:4]),
        "mc_is": probust.MonteCarloIS(model, 0.3, n_samples=200, mmse_samples=3)(x[:4]),
        "mc_cv": probust.MonteCarloCV(model, 0.3, n_samples=200, mmse_samples=3)(x[:4]),
    }
    for method, r in direct.items():
        names = ["p_mc", "p_linearised", "cv_beta"] if method == "mc_cv" else ["p_fail", "p_fail_error"]
        for name in names:
            # the runner's unit is this very call (points 0-3, the same plan): the same bits
            np.testing.assert_array_equal(rows.loc[method][name].to_numpy(), getattr(r, name).numpy())
    # without the option the analytic methods leave p_fail out; mc_is always has it
    df = run(tmp_path / "s", methods=["taylor", "mc_is"], sigmas=[0.3], limit=4)
    assert df[df.method == "taylor"].p_fail.isna().all() and df[df.method == "mc_is"].p_fail.notna().all()
    assert read_config(tmp_path / "s")["run"]["p_fail"] is False


def test_p_fail_is_a_run_setting(tmp_path):
    out = tmp_path / "r"
    run(out, limit=4, methods=["taylor_mvs"])
    with pytest.raises(ConfigMismatchError, match=r"p_fail: False there, True here"):
        run(out, limit=4, methods=["taylor_mvs"], p_fail=True, extend=True)
    with pytest.raises(ConfigError, match="^p_fail: "):
        run(tmp_path / "s", p_fail="yes")


def _make_old(out) -> None:
    """Turn a results folder into one written before the newer columns and the p_fail setting."""
    import json

    import pyarrow.parquet as pq

    from probust.run import store

    config = json.loads((out / "config.json").read_text())
    del config["run"]["p_fail"]
    (out / "config.json").write_text(json.dumps(config))
    for path in [out / "results.parquet", *(out / "parts").glob("*.parquet")]:
        if path.is_file():
            table = pq.read_table(path)
            meta = table.schema.metadata
            table = table.drop_columns(list(store.OPTIONAL_COLUMNS)).replace_schema_metadata(meta)
            pq.write_table(table, path)


def test_a_folder_from_before_the_newer_columns_resumes_and_extends(tmp_path):
    args = dict(methods=["mc", "taylor_mvs"], limit=8, sigmas=[0.3])
    out = tmp_path / "r"
    full = run(tmp_path / "full", **args)
    run(out, merge=False, **args)
    parts = sorted((out / "parts").glob("*.parquet"))
    parts[0].unlink()  # as if the run had died before this unit
    _make_old(out)
    old = read_results(out)
    lost = len(full) - len(old)
    assert old[NEWER].isna().all().all() and lost > 0
    # resume: the missing rows are computed, the table is the uninterrupted run's
    summary = execute(
        prepare(
            RunSettings(
                out=out,
                data=tiny_data(),
                model=tiny_model(),
                mc_samples=200,
                mmse_samples=3,
                unit_size=6,
                device="cpu",
                show_progress=False,
                **args,
            )
        )
    )
    assert summary.rows_computed == lost
    resumed = no_time(read_results(out))
    # n_drawn, boundaries_kept, the agreement columns and route are newer than the folder: its old rows
    # have none, the rows computed now do.
    newer = ["n_drawn", "boundaries_kept", "agreement", "agreement_draws", "route"]
    assert resumed.drop(columns=newer).equals(no_time(full).drop(columns=newer))
    new_mc = resumed[(resumed.method == "mc") & resumed.n_drawn.notna()]
    assert len(new_mc) and (new_mc.n_drawn == 200).all()
    # extend with mc_is: its rows carry p_fail, the old rows stay null
    df = run(out, extend=True, **{**args, "methods": ["mc", "taylor_mvs", "mc_is"]})
    assert df[df.method == "mc_is"].p_fail.notna().all() and df[df.method != "mc_is"].p_fail.isna().all()
    assert "p_fail" not in read_config(out)["run"]  # the folder's config is kept as it was


def test_adaptive_monte_carlo_stops_points_once_their_interval_is_narrow(tmp_path):
    out = tmp_path / "adaptive"
    df = run(out, methods=["mc", "mc_cv"], limit=12, sigmas=[0.3], mc_samples=4000, target_half_width=0.03)
    fixed = run(tmp_path / "fixed", methods=["mc"], limit=12, sigmas=[0.3], mc_samples=4000)
    mc = df[df.method == "mc"].set_index("index")
    # Draws come in whole checks of 1,000 (mc) or 500 (mc_cv), never beyond --mc-samples.
    assert (mc.n_drawn % 1000 == 0).all() and (mc.n_drawn <= 4000).all()
    assert ((df[df.method == "mc_cv"].n_drawn % 500) == 0).all()
    stopped = mc[mc.n_drawn < 4000]
    assert len(stopped) > 0, "some points of this model are far from every boundary"
    assert ((stopped.ci_high - stopped.ci_low) / 2 <= 0.03).all()
    # A point that ran to the end drew exactly the fixed run's draws: the same numbers.
    full = mc[mc.n_drawn == 4000].index
    pd.testing.assert_series_equal(mc.loc[full, "p"], fixed.set_index("index").loc[full, "p"])
    assert fixed.n_drawn.eq(4000).all()
    with pytest.raises(ConfigMismatchError, match=r"target_half_width: 0.03 there, 0.05 here"):
        run(out, methods=["mc", "mc_cv"], limit=12, sigmas=[0.3], mc_samples=4000, target_half_width=0.05)
    with pytest.raises(ConfigError, match="^target_half_width: "):
        run(tmp_path / "bad", methods=["mc"], limit=2, sigmas=[0.3], target_half_width=0.7)


def test_mc_cv_and_mc_is_linearise_with_the_runs_mmse_samples(tmp_path):
    # The MMSE linearisation inside mc_cv and mc_is takes the run's mmse_samples (the smallest of
    # several); its points are numbered by their data-set indices (7..10), not by their rows.
    ds, model = tiny_data(), tiny_model()
    x, _ = ds.tensors()
    args = {"methods": ["mc_cv", "mc_is"], "sigmas": [0.3], "indices": "7-10"}
    tables = {n: run(tmp_path / str(n), mmse_samples=n, **args) for n in (3, 5)}
    several = run(tmp_path / "several", mmse_samples=[10, 3], **args)
    for method, estimator in (("mc_cv", probust.MonteCarloCV), ("mc_is", probust.MonteCarloIS)):
        p = {n: df[df.method == method].sort_values("index").p.to_numpy() for n, df in tables.items()}
        for n in (3, 5):
            direct = estimator(model, 0.3, n_samples=200, mmse_samples=n, seed=0)(x[7:11], index_offset=7).p.numpy()
            np.testing.assert_allclose(p[n], direct, rtol=0, atol=1e-9)
        assert np.abs(p[3] - p[5]).max() > 1e-3, (method, p)
        np.testing.assert_allclose(several[several.method == method].sort_values("index").p, p[3], rtol=0, atol=1e-9)


def test_the_linearisation_copies_are_part_of_a_folders_identity(tmp_path):
    out = tmp_path / "r"
    args = {"methods": ["mc_cv"], "sigmas": [0.3], "limit": 3}
    run(out, mmse_samples=3, **args)
    assert read_config(out)["requests"][0]["mmse_samples"] == [3]
    with pytest.raises(ConfigMismatchError, match=r"mmse_samples: \[3\] there, \[5\] here"):
        run(out, mmse_samples=5, **args)
    # extending would mix mc_cv rows of two linearisations in one table
    with pytest.raises(ConfigMismatchError, match="linearised with 3 MMSE copies, this run would use 5"):
        run(out, mmse_samples=5, extend=True, **args)
    # more copies for mmse, or mc_cv with the same smallest count, extend the folder
    df = run(out, mmse_samples=[3, 5], extend=True, methods=["mc_cv", "mmse_mvs"], sigmas=[0.3], limit=3)
    assert sorted(set(zip(df.method, df.n_samples))) == [("mc_cv", 200), ("mmse_mvs", 3), ("mmse_mvs", 5)]


def tied_data() -> ImageDataset:
    """12 random 1x4x4 images; those at indices 3 and 8 have their first pixel at 1, the others at 0."""
    images = tiny_data(12).tensors()[0].mul(255).round().to(torch.uint8)
    images[:, 0, 0, 0] = 0
    images[[3, 8], 0, 0, 0] = 255
    return ImageDataset(images, torch.arange(12) % 3, name="tied", split="test", classes=["a", "b", "c"])


def tied_model() -> nn.Module:
    """Classes 0 and 1 share their weights and bias: their logits are exactly equal and the
    largest where the first pixel is 1 (points 3 and 8); class 2 wins alone elsewhere."""
    linear = nn.Linear(16, 3)
    with torch.no_grad():
        linear.weight.zero_()
        linear.weight[0, 0] = linear.weight[1, 0] = 1.0
        linear.bias.copy_(torch.tensor([0.0, 0.0, 0.5]))
    return nn.Sequential(nn.Flatten(), linear)


def test_a_tied_clean_prediction_stops_the_run_naming_its_indices_before_any_estimate(tmp_path):
    out = tmp_path / "r"
    with pytest.raises(TiedPredictionError) as info:
        run(out, data=tied_data(), model=tied_model())
    message = str(info.value)
    assert message.startswith("target: the clean prediction is tied between two classes at data-set indices [3, 8]")
    assert "(2 points)" in message and "target='label' (and overwrite=True" in message
    assert "indices='...' (and extend=True)" in message
    assert info.value.indices == [3, 8] and isinstance(info.value, ConfigError)
    assert not list((out / "parts").glob("*.parquet"))  # nothing was estimated
    # the ways out: leave the tied points out, or measure the true class
    df = run(out, data=tied_data(), model=tied_model(), indices=["0-2", "4-7", "9-11"], extend=True)
    assert sorted(set(df["index"])) == [0, 1, 2, 4, 5, 6, 7, 9, 10, 11] and (df.prediction == 2).all()
    labelled = run(tmp_path / "label", data=tied_data(), model=tied_model(), target="label")
    assert len(labelled) == 12 * len(SIGMAS) * len(FAST) and (labelled.target == labelled.label).all()
    # the prediction column keeps the lowest tied class
    assert (labelled[labelled["index"].isin([3, 8])].prediction == 0).all()


def test_only_points_still_to_compute_are_checked_and_the_first_five_are_named(tmp_path):
    out = tmp_path / "r"
    run(out, data=tied_data(), model=tied_model(), indices="0-2")  # no tie among these
    assert (
        execute(
            prepare(RunSettings(**arguments(out, data=tied_data(), model=tied_model(), indices="0-2")))
        ).rows_computed
        == 0
    )
    with pytest.raises(TiedPredictionError, match=r"indices \[8\] \(1 point\)"):
        run(out, data=tied_data(), model=tied_model(), indices=["0-2", "8"], extend=True)
    everywhere = nn.Sequential(nn.Flatten(), nn.Linear(16, 3))
    with torch.no_grad():
        everywhere[1].weight.zero_()
        everywhere[1].bias.copy_(torch.tensor([1.0, 1.0, 0.0]))
    with pytest.raises(TiedPredictionError, match=r"indices \[0, 1, 2, 3, 4\]\.\.\. \(7 points\)"):
        run(tmp_path / "all", data=tied_data(), model=everywhere, limit=7)


def test_prune_is_part_of_the_folders_identity(tmp_path):
    out = tmp_path / "r"
    df = run(out, methods=["taylor"], limit=4, prune="off")
    assert (df.boundaries_kept == 2).all()  # 3 classes: both other boundaries
    assert read_config(out)["run"]["prune"] == "off"
    with pytest.raises(ConfigMismatchError, match="prune"):
        run(out, methods=["taylor"], limit=4, prune="spectral")
    with pytest.raises(ConfigError, match="prune"):
        run(tmp_path / "bad", methods=["taylor"], limit=4, prune="sometimes")


def test_gradients_is_part_of_the_folders_identity_and_older_folders_imply_auto(tmp_path):
    import json

    out = tmp_path / "r"
    head = run(out, methods=["taylor"], limit=4, gradients="head")
    assert (head.route == "head").all()
    assert read_config(out)["run"]["gradients"] == "head"
    with pytest.raises(ConfigMismatchError, match="gradients"):
        run(out, methods=["taylor"], limit=4)
    # A folder written before the setting records none: it is "auto", and resumes as such.
    older = tmp_path / "older"
    first = run(older, methods=["taylor"], limit=2)
    config = json.loads((older / "config.json").read_text())
    del config["run"]["gradients"]
    (older / "config.json").write_text(json.dumps(config))
    resumed = run(older, methods=["taylor"], limit=4, extend=True)
    assert len(resumed) == 2 * len(first)
    kept = resumed[resumed["index"] < 2].sort_values(["sigma", "index"])["p"].tolist()
    assert kept == first.sort_values(["sigma", "index"])["p"].tolist()
    # One written with prune "on", which no longer exists, is refused, naming the setting.
    config["run"]["prune"] = "on"
    (older / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match="prune: on there, auto here"):
        run(older, methods=["taylor"], limit=4)
