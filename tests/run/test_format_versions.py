"""Results format version 2: the estimate table names the softmax probability of the clean
prediction ``clean_softmax``; the certify table has ``seconds`` and ``certified_<r>`` columns
without dots (``certified_0_25``); the authors' TSV keeps its own columns. A folder of another
format version is refused, naming the way out."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
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
)
from probust.run.certify import CertifySettings, certified_column, read_certified, run_certify, tsv_name

RADII = (0.0, 0.025, 0.25)


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


@pytest.mark.parametrize("recorded", [0, FORMAT_VERSION - 1, FORMAT_VERSION + 1, None])
def test_a_folder_of_another_format_is_refused_naming_the_way_out(tmp_path, tiny_data, tiny_model, recorded):
    out = tmp_path / "r"
    execute(prepare(estimate_settings(out, tiny_data, tiny_model)))
    config = read_config(out)
    config.pop("format_version")
    if recorded is not None:
        config["format_version"] = recorded
    (out / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigMismatchError, match="use overwrite=True to replace them, or another out folder"):
        prepare(estimate_settings(out, tiny_data, tiny_model))


def test_the_report_reads_both_tables_and_the_clean_softmax_column(tmp_path, tiny_data, tiny_model, capsys):
    root = tmp_path / "results"
    execute(prepare(estimate_settings(root / "old", tiny_data, tiny_model, methods=["mc", "taylor"])))
    # Without the softmax method, the wide table's "softmax" is the clean_softmax column.
    (run,) = load_results(root)
    wide = run.wide()
    expected = run.table.drop_duplicates("index").set_index("index").clean_softmax
    np.testing.assert_array_equal(wide.softmax, wide["index"].map(expected))
    run_certify(certify_settings(root / "cert", tiny_data, tiny_model))
    report = tmp_path / "report"
    only = ["class_bias", "distribution", "certified_accuracy"]
    assert main(["report", str(root), "--out", str(report), "--only", *only, "--quiet"]) == 0
    assert (report / "report.html").is_file()
    for name in only:
        assert list((report / "experiments" / name).glob("*.csv")), name
    certified = pd.read_csv(report / "experiments" / "certified_accuracy" / "certified_accuracy.csv")
    assert len(certified) == 1 and certified["points"].item() == 6


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
