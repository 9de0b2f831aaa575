"""Faults injected into a run: a full disk mid-write, damaged part files. Nothing already stored
is lost, the folder stays readable, and the same call again completes the uninterrupted table."""

from __future__ import annotations

import errno
import hashlib
import io
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from probust.run import ConfigError, run_estimate
from probust.run.reading import read_config, read_results
from probust.run.store import ResultStore, ResultsWriteError
from tests._helpers import tiny_data, tiny_model

# Every kind of row: Monte Carlo, the QMC mvn-cdf methods, the control variate, p_fail.
METHODS = ["mc", "taylor", "mmse", "mc_cv", "softmax"]


def run(out: Path, **kwargs) -> pd.DataFrame:
    args = dict(
        data=tiny_data(),
        model=tiny_model(),
        sigmas=[0.1, 0.3],
        methods=METHODS,
        out=out,
        mc_samples=100,
        mmse_samples=3,
        p_fail=True,
        limit=12,
        unit_size=4,
        device="cpu",
        show_progress=False,
    )
    return run_estimate(**{**args, **kwargs})


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory) -> pd.DataFrame:
    df = run(tmp_path_factory.mktemp("faults") / "reference").drop(columns="seconds")
    assert len(df) == 12 * 2 * len(METHODS) and df.p_fail.notna().any() and df.cv_beta.notna().any()
    return df


def _temporaries(out: Path) -> list[Path]:
    return [p for p in out.rglob("*") if p.name.endswith(".tmp")]


def _digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


# -- a full disk ----------------------------------------------------------------------------------

_real_write_table = pq.write_table
_real_replace = os.replace


def _full_disk() -> OSError:
    return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


class _Fault:
    """Counts the writes of files named ``*suffix`` and fails the ``nth`` one."""

    def __init__(self, suffix: str, nth: int) -> None:
        self.suffix, self.nth, self.seen, self.fired = suffix, nth, 0, False

    def hit(self, name: str) -> bool:
        if not name.endswith(self.suffix):
            return False
        self.seen += 1
        self.fired = self.fired or self.seen == self.nth
        return self.seen == self.nth


def _inject(monkeypatch, where: str, fault: _Fault) -> None:
    if where == "parquet":
        # The Parquet writer fails halfway through the file, after some bytes reached the disk.
        def write_table(table, f, **kwargs):
            # A part holds one block (4 points), results.parquet every row.
            if not fault.hit("results.parquet" if table.num_rows > 4 else "part.parquet"):
                return _real_write_table(table, f, **kwargs)
            buffer = io.BytesIO()
            _real_write_table(table, buffer, **kwargs)
            f.write(buffer.getvalue()[: len(buffer.getvalue()) // 2])
            raise _full_disk()

        monkeypatch.setattr(pq, "write_table", write_table)
    else:
        # The file was written and flushed, and the rename into place fails.
        def replace(src, dst, *args, **kwargs):
            if fault.hit(str(dst)):
                raise _full_disk()
            return _real_replace(src, dst, *args, **kwargs)

        monkeypatch.setattr(os, "replace", replace)


@pytest.mark.parametrize(
    ("where", "suffix", "nth"),
    [
        ("parquet", ".parquet", 7),  # a part, mid-run
        ("replace", ".parquet", 7),
        ("parquet", "results.parquet", 1),  # the merge at the end
        ("replace", "config.json", 2),  # the history's end, after every part
    ],
    ids=["part-write", "part-rename", "merge", "config"],
)
def test_a_full_disk_stops_the_run_with_one_line_and_the_same_call_completes_the_table(
    tmp_path, monkeypatch, uninterrupted, where, suffix, nth
):
    out = tmp_path / "r"
    fault = _Fault(suffix, nth)
    _inject(monkeypatch, where, fault)
    with pytest.raises(ResultsWriteError) as info:
        run(out)
    assert fault.fired
    message = str(info.value)
    assert info.value.errno == errno.ENOSPC and isinstance(info.value, OSError)
    assert "\n" not in message and message.startswith(f"cannot write to {out} (No space left on device")
    assert "run the same command again" in message
    monkeypatch.undo()

    assert _temporaries(out) == []  # the half-written file is gone
    partial = read_results(out)  # what was stored still reads
    assert len(partial) == (len(uninterrupted) if suffix != ".parquet" else 6 * 4)  # 6 parts of 4 points
    with ResultStore(out).lock():  # the failed run let go of the folder
        pass

    resumed = run(out).drop(columns="seconds")
    assert resumed.equals(uninterrupted)
    assert not list((out / "parts").iterdir()) and _temporaries(out) == []


def test_a_full_disk_before_any_work_is_an_error_about_out(tmp_path, monkeypatch, uninterrupted):
    out = tmp_path / "r"
    _inject(monkeypatch, "replace", _Fault("config.json", 1))  # the history's start
    with pytest.raises(ConfigError, match=rf"^out: cannot write {out}/config.json \(No space left on device\)$"):
        run(out)
    monkeypatch.undo()
    assert _temporaries(out) == [] and len(read_results(out)) == 0
    assert run(out).drop(columns="seconds").equals(uninterrupted)


def test_a_failed_rename_keeps_the_old_file_and_the_parts(tmp_path, monkeypatch, uninterrupted):
    # The merge's results.parquet replaces an older one (an extended folder): a failure leaves
    # the old one and every part, so no row is lost in between.
    out = tmp_path / "r"
    run(out, limit=8)
    before = _digest(out / "results.parquet")
    _inject(monkeypatch, "replace", _Fault("results.parquet", 1))
    with pytest.raises(ResultsWriteError):
        run(out, extend=True)
    monkeypatch.undo()
    assert _digest(out / "results.parquet") == before
    assert len(list((out / "parts").glob("*.parquet"))) == 2 * len(METHODS)  # the block of points 8-11
    assert read_results(out).drop(columns="seconds").equals(uninterrupted)


# -- a damaged part -------------------------------------------------------------------------------


def _cut(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:-100])


def _garbage(path: Path) -> None:
    path.write_bytes(b"PAR1" + os.urandom(200))


def _p_as_text(path: Path) -> None:
    table = pq.read_table(path)
    i = table.column_names.index("p")
    table = table.set_column(i, "p", pa.array([str(v) for v in table.column("p").to_pylist()]))
    pq.write_table(table, path)


def _index_as_float(path: Path) -> None:
    table = pq.read_table(path)
    i = table.column_names.index("index")
    pq.write_table(table.set_column(i, "index", table.column("index").cast(pa.float64())), path)


def _sigma_left_empty(path: Path) -> None:
    table = pq.read_table(path)
    i = table.column_names.index("sigma")
    sigma = table.column("sigma").to_pylist()
    pq.write_table(table.set_column(i, "sigma", pa.array([None, *sigma[1:]], pa.float64())), path)


def _flip_a_byte_of_p(path: Path) -> None:
    # The last byte of the p column's chunk lies in its data page, which the page's CRC covers.
    # (Without page checksums many single-byte changes in a part read back as other numbers,
    # silently: about a quarter of all positions in a small zstd Parquet file.)
    meta = pq.ParquetFile(path).metadata
    (i,) = [j for j in range(meta.num_columns) if meta.schema.column(j).name == "p"]
    chunk = meta.row_group(0).column(i)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data = bytearray(path.read_bytes())
    data[start + chunk.total_compressed_size - 1] ^= 0x10
    path.write_bytes(bytes(data))


DAMAGE = {
    "truncated": (_cut, "cannot read it"),
    "garbage": (_garbage, "cannot read it"),
    "p as text": (_p_as_text, "p is string, not double"),
    "index as float": (_index_as_float, "index is double, not int64"),
    "sigma left empty": (_sigma_left_empty, "rows without sigma"),
    "flipped byte": (_flip_a_byte_of_p, "cannot read it: .*(CRC|checksum)"),
}


@pytest.mark.parametrize("damage", list(DAMAGE))
def test_a_damaged_part_is_refused_by_name_on_read_and_on_resume_and_nothing_else_is_touched(
    tmp_path, uninterrupted, damage
):
    out = tmp_path / "r"
    run(out, merge=False)
    parts = sorted((out / "parts").glob("*.parquet"))
    victim = next(p for p in parts if p.name.startswith("taylor-"))
    spoil, reason = DAMAGE[damage]
    spoil(victim)
    others = {p: _digest(p) for p in parts if p != victim}

    expected = rf"results file {victim} is damaged \({reason}.*\); move it out of the folder"
    with pytest.raises(ValueError, match=expected) as info:
        read_results(out)
    assert "\n" not in str(info.value)
    with pytest.raises(ValueError, match=expected):
        read_results(victim)  # the file alone too
    with pytest.raises(ValueError, match=expected):
        run(out)  # the resume stops before computing anything
    assert {p: _digest(p) for p in others} == others  # the rest of the table is kept as it was
    assert sorted((out / "parts").glob("*.parquet")) == parts and _temporaries(out) == []

    # Doing what the message says: the damaged file's rows, and only they, are computed again.
    victim.rename(tmp_path / victim.name)
    assert len(read_results(out)) == len(uninterrupted) - 4
    assert run(out).drop(columns="seconds").equals(uninterrupted)


def test_a_damaged_merged_file_is_named_by_read_config_and_read_results(tmp_path):
    out = tmp_path / "r"
    run(out, limit=4, methods=["softmax"])
    merged = out / "results.parquet"
    _garbage(merged)
    for read in (read_config, read_results):
        with pytest.raises(ValueError, match=rf"results file {merged} is damaged \(cannot read"):
            read(merged)
    with pytest.raises(ValueError, match=rf"results file {merged} is damaged"):
        read_results(out)


def test_files_from_other_parquet_writers_with_equivalent_types_are_read(tmp_path, uninterrupted):
    out = tmp_path / "r"
    run(out, merge=False)
    part = sorted((out / "parts").glob("softmax-*.parquet"))[0]
    table = pq.read_table(part)
    for name, kind in (("method", pa.large_string()), ("label", pa.int32()), ("clean_softmax", pa.float32())):
        i = table.column_names.index(name)
        table = table.set_column(i, name, table.column(name).cast(kind))
    table = table.set_column(table.column_names.index("cv_beta"), "cv_beta", pa.nulls(len(table)))
    pq.write_table(table, part)
    df = read_results(out).drop(columns="seconds")
    assert df.drop(columns="clean_softmax").equals(uninterrupted.drop(columns="clean_softmax"))
    np.testing.assert_allclose(df.clean_softmax, uninterrupted.clean_softmax, rtol=1e-7)  # float32 there
