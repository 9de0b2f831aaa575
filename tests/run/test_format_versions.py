"""Results format version 2 renamed columns: the estimate table's ``confidence`` (the softmax
probability of the clean prediction, not a CI level) is ``clean_softmax``; the certify table's
``time_s`` is ``seconds`` and its ``certified_<repr(r)>`` (``certified_0.25``) are
``certified_0_25``. Folders of version 1 (earlier releases) still read, under the new names, and
resuming or extending one upgrades it; the authors' TSV is unchanged."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from probust.cli import main
from probust.experiments import load_results
from probust.run import (
    FORMAT_VERSION,
    ConfigMismatchError,
    RunSettings,
    execute,
    prepare,
    read_config,
    read_results,
    read_results_config,
)
from probust.run.certify import CertifySettings, certified_column, read_certified, run_certify, tsv_name
from probust.run.files import CONFIG_META_KEY
from probust.run.store import FORMER_FORMAT_VERSIONS

#: The columns version 1 wrote under other names: (name there, name now).
ESTIMATE_V1 = {"clean_softmax": "confidence"}
RADII = (0.0, 0.025, 0.25)


def certify_v1(radii=RADII) -> dict[str, str]:
    """The certify table's columns as version 1 named them (new name -> old name)."""
    return {"seconds": "time_s", **{certified_column(r): f"certified_{float(r)!r}" for r in radii}}


def _to_version_1(folder: Path, old_names: dict[str, str], probust_version: str | None = None) -> None:
    """Rewrite a folder as a release of format 1 wrote it: every Parquet file's columns under their old
    names and ``"format_version": 1`` in config.json (and in a merged file's metadata)."""
    for path in [folder / "results.parquet", *sorted((folder / "parts").glob("*.parquet"))]:
        if not path.is_file():
            continue
        table = pq.read_table(path)
        table = table.rename_columns([old_names.get(c, c) for c in table.column_names])
        meta = dict(table.schema.metadata or {})
        if CONFIG_META_KEY in meta:
            config = json.loads(meta[CONFIG_META_KEY])
            if "format_version" in config:
                meta[CONFIG_META_KEY] = json.dumps({**config, "format_version": 1}).encode()
        pq.write_table(table.replace_schema_metadata(meta), path)
    config = json.loads((folder / "config.json").read_text())
    config["format_version"] = 1
    if probust_version is not None:
        config["probust_version"] = probust_version
        for entry in config["history"]:
            entry["probust_version"] = probust_version
    (folder / "config.json").write_text(json.dumps(config, indent=2))


def _stored_names(folder: Path) -> list[set[str]]:
    files = [folder / "results.parquet", *sorted((folder / "parts").glob("*.parquet"))]
    return [set(pq.read_schema(p).names) for p in files if p.is_file()]


def estimate_settings(out, data, model, **changes) -> RunSettings:
    args = dict(
        data=data,
        model=model,
        sigmas=[0.3],
        methods=["softmax", "mc", "taylor"],
        out=out,
        limit=4,
        unit_size=2,
        mc_samples=50,
        device="cpu",
        show_progress=False,
    )
    return RunSettings(**(args | changes))


def no_time(frame: pd.DataFrame) -> pd.DataFrame:
    return frame.drop(columns="seconds")


# -- names ----------------------------------------------------------------------------------------


def test_this_version_writes_format_2_which_renamed_only_and_reads_1():
    assert FORMAT_VERSION == 2 and FORMER_FORMAT_VERSIONS == (1,)


@pytest.mark.parametrize(
    ("radius", "column"),
    [
        (0.25, "certified_0_25"),
        (0.025, "certified_0_025"),
        (0.0, "certified_0"),
        (-0.0, "certified_0"),
        (1.0, "certified_1"),
        (1.5, "certified_1_5"),
        (1e-05, "certified_0_00001"),
        (0.1 + 0.2, "certified_0_30000000000000004"),
        (2, "certified_2"),
    ],
)
def test_a_radius_column_has_no_dot_and_reads_as_the_radius(radius, column):
    assert certified_column(radius) == column
    assert "." not in column and "-" not in column and column.isidentifier()
    # the digits after "certified_", with "." for the first "_", give the radius back exactly
    assert float(column.removeprefix("certified_").replace("_", ".", 1)) == float(radius)


def test_two_radii_never_share_a_column():
    radii = np.concatenate([np.linspace(0, 2, 2001), [0.1 + 0.2, 0.3, 1e-9, 1e-10, 123456.789]])
    columns = {certified_column(float(r)) for r in radii}
    assert len(columns) == len(set(radii.tolist()))


# -- probust estimate's table -----------------------------------------------------------------------


def test_the_estimate_table_names_the_clean_softmax_probability_not_confidence(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "r"
    execute(prepare(estimate_settings(out, tiny_data, tiny_model)))
    df = read_results(out)
    assert "clean_softmax" in df.columns and "confidence" not in df.columns
    assert _stored_names(out) == [set(df.columns)]
    # the softmax method's p is the same quantity as the column, on every row of the point
    soft = df[df.method == "softmax"].set_index("index").clean_softmax
    np.testing.assert_array_equal(df.clean_softmax, df["index"].map(soft))
    assert read_config(out)["format_version"] == FORMAT_VERSION


def test_a_version_1_parquet_file_made_by_hand_reads_under_the_new_names(tmp_path):
    rows = 3
    v1 = pa.table(
        {
            "index": pa.array([0, 1, 2], pa.int64()),
            "label": pa.array([0, 1, 2], pa.int64()),
            "prediction": pa.array([0, 1, 1], pa.int64()),
            "target": pa.array([0, 1, 1], pa.int64()),
            "sigma": pa.array([0.1] * rows),
            "method": pa.array(["softmax"] * rows),
            "n_samples": pa.array([0] * rows, pa.int64()),
            "p": pa.array([0.9, 0.8, 0.7]),
            "ci_low": pa.nulls(rows, pa.float64()),
            "ci_high": pa.nulls(rows, pa.float64()),
            "stderr": pa.nulls(rows, pa.float64()),
            "confidence": pa.array([0.9, 0.8, 0.7]),
            "cdf_error": pa.nulls(rows, pa.float64()),
            "seconds": pa.array([1e-3] * rows),
            "seed": pa.array([0] * rows, pa.int64()),
        }
    )
    pq.write_table(v1, tmp_path / "old.parquet")
    df = read_results(tmp_path / "old.parquet")
    assert "confidence" not in df.columns and df.clean_softmax.tolist() == [0.9, 0.8, 0.7]
    assert df.columns.tolist() == read_results(tmp_path / "old.parquet").columns.tolist()
    # a folder of it, as such a release wrote one (config.json marked format version 1)
    folder = tmp_path / "folder"
    (folder / "parts").mkdir(parents=True)
    pq.write_table(v1, folder / "parts" / "softmax-n0-sigma0.1-00000000-00000002.parquet")
    config = {"format": "probust.results", "format_version": 1, "probust_version": "0.3.0", "run": {}, "history": []}
    (folder / "config.json").write_text(json.dumps(config))
    pd.testing.assert_frame_equal(read_results(folder), df)


@pytest.mark.parametrize("merge", [True, False])
def test_a_version_1_folder_reads_resumes_and_extends_into_version_2(tmp_path, tiny_data, tiny_model, merge):
    out = tmp_path / "old"
    execute(prepare(estimate_settings(out, tiny_data, tiny_model, merge=merge)))
    written = read_results(out)
    _to_version_1(out, ESTIMATE_V1)
    assert all("confidence" in names and "clean_softmax" not in names for names in _stored_names(out))
    # read: the same table under the new names
    pd.testing.assert_frame_equal(read_results(out), written)
    # resume the same grid: nothing to compute, the folder is marked as this version's
    summary = execute(prepare(estimate_settings(out, tiny_data, tiny_model, merge=merge)))
    assert summary.rows_computed == 0
    config = read_config(out)
    assert config["format_version"] == FORMAT_VERSION
    (upgrade,) = config["format_upgrades"]
    assert (upgrade["from"], upgrade["to"]) == (1, FORMAT_VERSION) and upgrade["at"]
    pd.testing.assert_frame_equal(no_time(read_results(out)), no_time(written))
    # extend: version 1 and version 2 files side by side (without the merge) read as one table,
    # the same as a folder computed by this version alone
    summary = execute(prepare(estimate_settings(out, tiny_data, tiny_model, limit=8, extend=True, merge=merge)))
    assert summary.rows_computed == 4 * 3
    fresh = execute(prepare(estimate_settings(tmp_path / "new", tiny_data, tiny_model, limit=8)))
    assert fresh.rows_computed == 8 * 3
    pd.testing.assert_frame_equal(no_time(read_results(out)), no_time(read_results(tmp_path / "new")))
    names = _stored_names(out)
    if merge:  # the merge rewrote every row under the new names
        assert names == [set(written.columns)]
    else:
        assert {"confidence" in n for n in names} == {True, False}
    # one upgrade only; later calls resume as usual
    assert len(read_config(out)["format_upgrades"]) == 1
    assert execute(prepare(estimate_settings(out, tiny_data, tiny_model, limit=8))).rows_computed == 0


def test_a_folder_recording_settings_under_their_former_names_reads_resumes_and_extends(
    tmp_path, tiny_data, tiny_model
):
    """This release renamed three recorded settings to the estimators' names (ci_level, mmse_sampling,
    mc_half_width); a folder written before keeps its identity under the new names."""
    out = tmp_path / "old"
    chosen = dict(confidence=0.9, sampling="iid", target_half_width=0.2)
    execute(prepare(estimate_settings(out, tiny_data, tiny_model, **chosen)))
    written = read_results(out)
    config = read_config(out)
    former = {"ci_level": "confidence", "mmse_sampling": "sampling", "mc_half_width": "target_half_width"}
    for old, now in former.items():
        config["run"][old] = config["run"].pop(now)
    (out / "config.json").write_text(json.dumps(config))
    s = read_results_config(out).settings
    assert (s.confidence, s.sampling, s.target_half_width) == (0.9, "iid", 0.2)
    assert execute(prepare(estimate_settings(out, tiny_data, tiny_model, **chosen))).rows_computed == 0
    with pytest.raises(ConfigMismatchError, match=r"confidence: 0.9 there, 0.95 here"):
        prepare(estimate_settings(out, tiny_data, tiny_model, **(chosen | {"confidence": 0.95})))
    summary = execute(prepare(estimate_settings(out, tiny_data, tiny_model, limit=6, extend=True, **chosen)))
    assert summary.rows_computed == 2 * 3
    # extending rewrote the configuration under today's names
    assert set(former).isdisjoint(read_config(out)["run"]) and set(former.values()) <= set(read_config(out)["run"])
    pd.testing.assert_frame_equal(no_time(read_results(out)).iloc[: len(written)], no_time(written))


def test_a_version_1_folder_of_another_probust_version_still_needs_allow_version_change(
    tmp_path, tiny_data, tiny_model
):
    out = tmp_path / "old"
    execute(prepare(estimate_settings(out, tiny_data, tiny_model)))
    _to_version_1(out, ESTIMATE_V1, probust_version="0.2.9")
    with pytest.raises(
        ConfigMismatchError, match=r"written by probust 0\.2\.9, this is probust .*allow_version_change"
    ):
        prepare(estimate_settings(out, tiny_data, tiny_model))
    assert read_config(out)["format_version"] == 1  # refused: nothing changed
    plan = prepare(estimate_settings(out, tiny_data, tiny_model, allow_version_change=True))
    assert execute(plan).rows_computed == 0
    config = read_results_config(out)
    assert config.format_version == FORMAT_VERSION and config.history[-1].allow_version_change


@pytest.mark.parametrize("recorded", [0, FORMAT_VERSION + 1, None])
def test_a_format_this_version_cannot_read_is_still_refused_naming_the_way_out(
    tmp_path, tiny_data, tiny_model, recorded
):
    out = tmp_path / "r"
    execute(prepare(estimate_settings(out, tiny_data, tiny_model)))
    config = read_config(out)
    config.pop("format_version")
    if recorded is not None:
        config["format_version"] = recorded
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match="use overwrite=True to replace them, or another out folder"):
        prepare(estimate_settings(out, tiny_data, tiny_model))


def test_the_report_reads_a_version_1_folder(tmp_path, tiny_data, tiny_model, capsys):
    root = tmp_path / "results"
    execute(prepare(estimate_settings(root / "old", tiny_data, tiny_model, methods=["mc", "taylor"])))
    _to_version_1(root / "old", ESTIMATE_V1)
    # Without the softmax method, the wide table's "softmax" is the clean_softmax column.
    (run,) = load_results(root)
    wide = run.wide()
    expected = run.table.drop_duplicates("index").set_index("index").clean_softmax
    np.testing.assert_array_equal(wide.softmax, wide["index"].map(expected))
    run_certify(certify_settings(root / "cert", tiny_data, tiny_model))
    _to_version_1(root / "cert", certify_v1())
    report = tmp_path / "report"
    only = ["class_bias", "distribution", "certified_accuracy"]
    assert main(["report", str(root), "--out", str(report), "--only", *only, "--quiet"]) == 0
    assert (report / "report.html").is_file()
    for name in only:
        assert list((report / "experiments" / name).glob("*.csv")), name
    certified = pd.read_csv(report / "experiments" / "certified_accuracy" / "certified_accuracy.csv")
    assert len(certified) == 1 and certified["points"].item() == 6
    # reading upgrades nothing
    assert read_config(root / "old")["format_version"] == read_config(root / "cert")["format_version"] == 1


# -- probust certify's table ------------------------------------------------------------------------


def certify_settings(out, data, model, **changes) -> CertifySettings:
    args = dict(
        data=data,
        model=model,
        sigmas=[0.25],
        out=out,
        limit=6,
        n0=16,
        n=64,
        radii=list(RADII),
        unit_size=3,
        device="cpu",
        show_progress=False,
    )
    return CertifySettings(**(args | changes))


def test_the_certify_table_has_seconds_and_radius_columns_without_dots(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "c"
    run_certify(certify_settings(out, tiny_data, tiny_model))
    df = read_certified(out)
    assert "time_s" not in df.columns and (df.seconds > 0).all()
    assert [c for c in df.columns if c.startswith("certified_")] == ["certified_0", "certified_0_025", "certified_0_25"]
    assert not [c for c in df.columns if "." in c]
    assert read_config(out)["format_version"] == FORMAT_VERSION
    # the authors' TSV keeps its own columns
    assert (out / tsv_name(0.25)).read_text().splitlines()[0] == "idx\tlabel\tpredict\tradius\tcorrect\ttime"


def test_a_version_1_certify_folder_reads_resumes_and_extends(tmp_path, tiny_data, tiny_model):
    out = tmp_path / "old"
    run_certify(certify_settings(out, tiny_data, tiny_model))
    written = read_certified(out)
    tsv = (out / tsv_name(0.25)).read_bytes()
    _to_version_1(out, certify_v1())
    assert _stored_names(out) == [{certify_v1().get(c, c) for c in written.columns}]
    assert "certified_0.025" in _stored_names(out)[0]
    pd.testing.assert_frame_equal(read_certified(out), written)
    # resume: nothing computed, the TSV left as it was (same text), the folder marked version 2
    summary = run_certify(certify_settings(out, tiny_data, tiny_model))
    assert summary.rows_computed == 0 and (out / tsv_name(0.25)).read_bytes() == tsv
    assert read_config(out)["format_version"] == FORMAT_VERSION
    # extend with a sigma: every row under the new names after the merge, a TSV per sigma
    summary = run_certify(certify_settings(out, tiny_data, tiny_model, sigmas=[0.25, 0.5], extend=True))
    assert summary.rows_computed == 6
    df = read_certified(out)
    assert _stored_names(out) == [set(df.columns)] and set(written.columns) == set(df.columns)
    pd.testing.assert_frame_equal(df[df.sigma == 0.25].reset_index(drop=True), written)
    assert (out / tsv_name(0.25)).read_bytes() == tsv and (out / tsv_name(0.5)).is_file()
