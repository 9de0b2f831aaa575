"""The files of a results folder: the Parquet schema of the rows, atomic writes, reading one file.

:mod:`probust.run.store` builds the folder on these; see :func:`probust.run.store.read_results`
for what each column means.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from probust._io import atomic_write
from probust.run.errors import first_line

__all__ = [
    "CONFIG_META_KEY",
    "KEY",
    "OPTIONAL_COLUMNS",
    "SCHEMA",
    "atomic_write_table",
    "is_data_file",
    "make_table",
    "read_table_file",
    "to_frame",
]

#: The key of the run's configuration in a Parquet file's key-value metadata.
CONFIG_META_KEY = b"probust.config"

#: Columns that identify a row: one row per (point, noise level, method, sample count).
KEY: tuple[str, ...] = ("index", "sigma", "method", "n_samples")

#: The table's columns, in order (see :func:`probust.run.store.read_results` for their meaning).
SCHEMA = pa.schema(
    [
        ("index", pa.int64()),
        ("label", pa.int64()),
        ("prediction", pa.int64()),
        ("target", pa.int64()),
        ("sigma", pa.float64()),
        ("method", pa.string()),
        ("n_samples", pa.int64()),
        ("p", pa.float64()),
        ("ci_low", pa.float64()),
        ("ci_high", pa.float64()),
        ("stderr", pa.float64()),
        ("confidence", pa.float64()),
        ("cdf_error", pa.float64()),
        ("p_fail", pa.float64()),
        ("p_fail_error", pa.float64()),
        ("p_mc", pa.float64()),
        ("p_linearised", pa.float64()),
        ("cv_beta", pa.float64()),
        ("n_drawn", pa.float64()),
        ("boundaries_kept", pa.int64()),
        ("seconds", pa.float64()),
        ("seed", pa.int64()),
    ]
)

#: Columns added after the first results format (the Estimate fields of "mc_cv", "mc_is" and
#: ``p_fail``): a writer may leave them out and files written before them still read, both
#: giving nulls.
OPTIONAL_COLUMNS: tuple[str, ...] = (
    "p_fail",
    "p_fail_error",
    "p_mc",
    "p_linearised",
    "cv_beta",
    "n_drawn",
    "boundaries_kept",
)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    """Write a Parquet file (zstd) whole or not at all (:func:`probust._io.atomic_write`)."""
    atomic_write(path, lambda f: pq.write_table(table, f, compression="zstd"))


def is_data_file(path: Path) -> bool:
    return path.suffix == ".parquet" and not path.name.startswith((".", "_"))


def read_table_file(path: Path, columns: Sequence[str] | None) -> pa.Table:
    schema = SCHEMA if columns is None else pa.schema([SCHEMA.field(c) for c in columns])
    try:
        with pq.ParquetFile(path) as parquet:
            present = set(parquet.schema_arrow.names)
            table = parquet.read(columns=[c for c in schema.names if c in present])
    except FileNotFoundError:
        raise
    except Exception as exc:  # a damaged file (only possible after disk trouble): name it
        raise ValueError(f"cannot read results file {path}: {first_line(exc)}; delete it and run again") from None
    absent = [name for name in schema.names if name not in present]
    required = [name for name in absent if name not in OPTIONAL_COLUMNS]
    if required:
        raise ValueError(f"results file {path} lacks the columns {required}; it was not written by probust")
    # A file written before the optional columns existed: they are null in its rows.
    for name in absent:
        table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
    return table.select(schema.names).cast(schema).replace_schema_metadata(None)


def make_table(columns: dict[str, Any]) -> pa.Table:
    """A :data:`SCHEMA` table from one array per column (None, or an optional column left out:
    all nulls).

    Raises:
        ValueError: unknown or missing columns, or columns of different lengths.
    """
    unknown = set(columns) - set(SCHEMA.names)
    missing = set(SCHEMA.names) - set(columns) - set(OPTIONAL_COLUMNS)
    if unknown or missing:
        raise ValueError(
            f"results columns do not match the schema: unknown {sorted(unknown)}, missing {sorted(missing)}"
        )
    lengths = {len(v) for v in columns.values() if v is not None}
    if len(lengths) != 1:
        raise ValueError(f"results columns have different lengths: {sorted(lengths)}")
    (n,) = lengths
    arrays = [
        pa.nulls(n, field.type) if columns.get(field.name) is None else pa.array(columns[field.name], type=field.type)
        for field in SCHEMA
    ]
    return pa.Table.from_arrays(arrays, schema=SCHEMA)


def to_frame(table: pa.Table) -> Any:
    frame = table.to_pandas()
    frame = frame.sort_values(list(KEY), kind="stable")
    # A kill during merge() can leave a row both in a part and in results.parquet.
    frame = frame.drop_duplicates(subset=list(KEY), keep="first")
    return frame.reset_index(drop=True)
