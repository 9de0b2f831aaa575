"""The results folder: atomic parts, reading mid-run, merging, locking."""

from __future__ import annotations

import io

import numpy as np
import pandas as pd
import pytest

from probust import _io
from probust.run import reading, store
from probust.run.reading import read_config, read_results
from probust.run.store import KEY, SCHEMA, FolderLockedError, ResultStore


def _columns(indices, sigma=0.1, method="mc", n=100, p=None):
    indices = np.asarray(indices, dtype=np.int64)
    k = len(indices)
    mc = method == "mc"
    return {
        "index": indices,
        "label": indices % 3,
        "prediction": indices % 3,
        "target": indices % 3,
        "sigma": np.full(k, sigma),
        "method": [method] * k,
        "n_samples": np.full(k, n if method in ("mc", "mmse") else 0),
        "p": np.linspace(0, 1, k) if p is None else p,
        "ci_low": np.zeros(k) if mc else None,
        "ci_high": np.ones(k) if mc else None,
        "stderr": np.full(k, 0.01) if mc else None,
        "clean_softmax": np.full(k, 0.9),
        "cdf_error": None,
        "seconds": np.full(k, 0.5),
        "seed": np.zeros(k, dtype=np.int64),
    }


@pytest.fixture
def folder(tmp_path):
    s = ResultStore(tmp_path / "out")
    s.create()
    return s


def test_parts_are_read_back_sorted_with_the_documented_columns(folder):
    folder.write_part("b", _columns([5, 6], sigma=0.2))
    folder.write_part("a", _columns([7, 0, 1], method="softmax"))
    folder.write_part("c", _columns([0, 1], sigma=0.2))
    df = read_results(folder.path)
    assert list(df.columns) == SCHEMA.names
    assert len(df) == 7
    assert df[list(KEY)].equals(df[list(KEY)].sort_values(list(KEY)).reset_index(drop=True))
    assert df["index"].dtype == np.int64 and df["p"].dtype == np.float64
    soft = df[df.method == "softmax"]
    assert soft["ci_low"].isna().all() and soft["stderr"].isna().all() and (soft["n_samples"] == 0).all()
    assert df["cdf_error"].isna().all()
    for name in SCHEMA.names:  # every column is documented where read_results points
        assert f"``{name}``" in reading.__doc__


def test_half_written_files_are_never_read_and_are_cleaned_up(folder):
    folder.write_part("a", _columns([0, 1]))
    (folder.parts_dir / ".b.parquet.123.tmp").write_bytes(b"PAR1 half a file")
    (folder.parts_dir / "notes.txt").write_text("not data")
    assert len(read_results(folder.path)) == 2
    assert folder.remove_temporaries() == 1
    assert (folder.parts_dir / "notes.txt").exists()


def test_writing_a_part_leaves_no_temporary_and_never_overwrites(folder):
    folder.write_part("a", _columns([0, 1]))
    second = folder.write_part("a", _columns([2, 3]))
    assert second.name != "a.parquet"
    assert sorted(p.name.startswith(".") for p in folder.parts_dir.iterdir()) == [False, False]
    assert read_results(folder.path)["index"].tolist() == [0, 1, 2, 3]


def test_merge_compacts_parts_and_keeps_the_config(folder):
    folder.write_config({"format": "probust.results", "run": {"seed": 3}})
    folder.write_part("a", _columns([3, 4]))
    folder.write_part("b", _columns([0, 1, 2]))
    before = read_results(folder.path)
    merged = store.merge(folder.path)
    assert merged.name == "results.parquet"
    assert not list(folder.parts_dir.glob("*.parquet"))
    assert read_results(folder.path).equals(before)
    assert read_results(merged).equals(before)
    assert read_config(merged)["run"]["seed"] == 3
    assert pd.read_parquet(merged).shape == before.shape  # plain pandas reads it too


def test_both_layouts_are_read_together_and_duplicates_appear_once(folder):
    folder.write_part("a", _columns([0, 1, 2]))
    folder.merge()
    folder.write_part("b", _columns([2, 3]))  # index 2 again: a merge killed before deleting parts
    df = read_results(folder.path)
    assert df["index"].tolist() == [0, 1, 2, 3]
    assert set(folder.completed()) == {(0.1, "mc", 100)}
    assert folder.completed()[(0.1, "mc", 100)].tolist() == [0, 1, 2, 3]


def test_empty_folder_gives_an_empty_table_with_the_schema(folder):
    df = read_results(folder.path)
    assert len(df) == 0 and list(df.columns) == SCHEMA.names
    assert folder.completed() == {}
    with pytest.raises(FileNotFoundError):
        read_results(folder.path / "nope")


def test_a_damaged_part_is_named(folder):
    (folder.parts_dir / "x.parquet").write_bytes(b"garbage")
    with pytest.raises(ValueError, match="x.parquet"):
        read_results(folder.path)


def test_bad_columns_are_refused(folder):
    cols = _columns([0, 1])
    del cols["seed"]
    with pytest.raises(ValueError, match="missing"):
        folder.write_part("a", cols)
    cols = _columns([0, 1])
    cols["p"] = np.zeros(3)
    with pytest.raises(ValueError, match="lengths"):
        folder.write_part("a", cols)


def test_the_lock_keeps_a_second_writer_out(folder):
    other = ResultStore(folder.path)
    with folder.lock():
        with pytest.raises(FolderLockedError, match="another run"):
            other.acquire_lock()
        with pytest.raises(FolderLockedError):
            store.merge(folder.path)
    with other.lock():
        pass


def test_clear_removes_only_what_probust_wrote(folder):
    folder.write_config({"format": "probust.results"})
    folder.write_part("a", _columns([0]))
    folder.merge()
    (folder.path / "mine.txt").write_text("keep")
    folder.clear()
    assert sorted(p.name for p in folder.path.iterdir() if not p.name.startswith(".")) == ["mine.txt", "parts"]
    assert folder.read_config() is None


def test_an_exception_mid_write_leaves_the_old_config_and_merged_file_intact(folder, monkeypatch):
    import pyarrow.parquet as pq

    folder.write_config({"a": 1})
    folder.write_part("a", _columns([0, 1]))
    folder.merge()
    folder.write_part("b", _columns([2, 3]))
    config_before, merged_before = folder.config_path.read_bytes(), folder.merged_path.read_bytes()
    real_write_table = pq.write_table

    class Boom(Exception):
        pass

    def half_then_fail(f, data: bytes):
        f.write(data[: len(data) // 2])
        f.flush()
        raise Boom

    # config.json: the new text is half written when the writer fails
    monkeypatch.setattr(
        store, "atomic_write_bytes", lambda path, data: _io.atomic_write(path, lambda f: half_then_fail(f, data))
    )
    with pytest.raises(Boom):
        folder.write_config({"a": 2, "padding": "x" * 1000})

    # results.parquet: the merge fails halfway through the new file
    def write_table(table, f, **kwargs):
        buffer = io.BytesIO()
        real_write_table(table, buffer, **kwargs)
        half_then_fail(f, buffer.getvalue())

    monkeypatch.setattr(pq, "write_table", write_table)
    with pytest.raises(Boom):
        folder.merge()
    monkeypatch.undo()

    assert folder.config_path.read_bytes() == config_before and folder.read_config() == {"a": 1}
    assert folder.merged_path.read_bytes() == merged_before
    assert [p.name for p in folder.path.rglob("*.tmp")] == []
    assert read_results(folder.path)["index"].tolist() == [0, 1, 2, 3]  # the part was kept too
    folder.write_config({"a": 3})  # and the next write goes through, readable by everyone
    assert folder.read_config() == {"a": 3} and folder.config_path.stat().st_mode & 0o044


def _old_table(columns: dict):
    """A table in the first results format: no optional columns."""
    table = store.make_table(columns)
    return table.drop_columns(list(store.OPTIONAL_COLUMNS))


def test_the_estimate_fields_are_nullable_columns_that_may_be_left_out(folder):
    cols = _columns([0, 1, 2], method="mc_is")
    cols["p_fail"] = np.array([1e-9, 0.0, 2e-3])
    cols["p_fail_error"] = np.array([0.01, np.inf, 0.1])
    folder.write_part("a", cols)
    folder.write_part("b", _columns([0, 1]))  # no optional column given: nulls
    df = read_results(folder.path)
    is_ = df[df.method == "mc_is"]
    assert is_.p_fail.tolist() == [1e-9, 0.0, 2e-3] and np.isinf(is_.p_fail_error.iloc[1])
    assert df[df.method == "mc"][list(store.OPTIONAL_COLUMNS)].isna().all().all()
    assert df[["p_mc", "p_linearised", "cv_beta"]].isna().all().all()
    # Numbers read as float64 (NaN for null); the route, a name, as strings (None for null).
    assert all(df[c].dtype == np.float64 for c in store.OPTIONAL_COLUMNS if c != "route")
    assert not pd.api.types.is_numeric_dtype(df.route) and df.route.isna().all()


def test_files_written_before_the_optional_columns_still_read_and_merge(folder):
    import pyarrow.parquet as pq

    pq.write_table(_old_table(_columns([0, 1])), folder.merged_path)
    pq.write_table(_old_table(_columns([2, 3])), folder.parts_dir / "old.parquet")
    cols = _columns([4], method="mc_is")
    cols["p_fail"] = np.array([1e-6])
    folder.write_part("new", cols)
    df = read_results(folder.path)
    assert list(df.columns) == SCHEMA.names and len(df) == 5
    assert df.p_fail.isna().sum() == 4 and df.p_fail.dropna().tolist() == [1e-6]
    assert folder.completed()[(0.1, "mc", 100)].tolist() == [0, 1, 2, 3]
    merged = folder.merge()
    assert pq.read_schema(merged).names == SCHEMA.names
    pd.testing.assert_frame_equal(read_results(merged), df)
    # a file lacking a column that was always there is not a probust file
    pq.write_table(_old_table(_columns([5])).drop_columns(["seed"]), folder.parts_dir / "bad.parquet")
    with pytest.raises(ValueError, match=r"bad.parquet lacks the columns \['seed'\]"):
        read_results(folder.path)
