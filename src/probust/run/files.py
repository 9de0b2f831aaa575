"""The files of a results folder: the Parquet schema of the rows, atomic writes, reading one file.

:mod:`probust.run.store` builds the folder on these; see :func:`probust.run.reading.read_results`
for what each column means.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from probust._io import atomic_write
from probust.run.errors import first_line

__all__ = [
    "CONFIG_META_KEY",
    "ESTIMATE",
    "KEY",
    "Layout",
    "OPTIONAL_COLUMNS",
    "SCHEMA",
    "atomic_write_table",
    "damaged",
    "is_data_file",
    "make_table",
    "read_table_file",
    "to_frame",
]

#: The key of the run's configuration in a Parquet file's key-value metadata.
CONFIG_META_KEY = b"probust.config"

#: Columns that identify a row: one row per (point, noise level, method, sample count).
KEY: tuple[str, ...] = ("index", "sigma", "method", "n_samples")

#: The table's columns, in order (see :func:`probust.run.reading.read_results` for their meaning).
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
        ("clean_softmax", pa.float64()),
        ("cdf_error", pa.float64()),
        ("p_fail", pa.float64()),
        ("p_fail_error", pa.float64()),
        ("p_mc", pa.float64()),
        ("p_linearised", pa.float64()),
        ("cv_beta", pa.float64()),
        ("n_drawn", pa.float64()),
        ("boundaries_kept", pa.int64()),
        ("agreement", pa.float64()),
        ("agreement_draws", pa.int64()),
        ("route", pa.string()),
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
    "agreement",
    "agreement_draws",
    "route",
)


@dataclass(frozen=True)
class Layout:
    """The table one kind of results folder holds (``probust estimate``'s, ``probust certify``'s).

    Attributes:
        format: ``config.json``'s "format": what marks a folder as holding this table.
        schema: the columns, in order, with their types.
        key: the columns that identify a row; the first is the point's index, the others the
            work unit's grid key (what :meth:`probust.run.store.ResultStore.completed` groups by).
        optional: columns a writer may leave out (nulls) and that older files may lack.
        implied: how a ``config.json`` "run" section of this kind of folder reads today, where an
            earlier version did not record a setting (or recorded it otherwise): the section with
            what that version ran filled in. None: as written.
        resumable: recorded settings (their key is the option's name) whose value in the folder
            a refusal to resume suggests giving, when they are all that differs.
    """

    format: str
    schema: pa.Schema
    key: tuple[str, ...]
    optional: tuple[str, ...] = ()
    implied: Callable[[Mapping[str, Any]], dict[str, Any]] | None = None
    resumable: tuple[str, ...] = ()

    @property
    def grid_key(self) -> tuple[str, ...]:
        """The key without the point's index: one value per work unit's task."""
        return self.key[1:]


#: ``probust estimate``'s table.
ESTIMATE = Layout("probust.results", SCHEMA, KEY, OPTIONAL_COLUMNS)


def atomic_write_table(path: Path, table: pa.Table) -> None:
    """Write a Parquet file (zstd) whole or not at all (:func:`probust._io.atomic_write`).

    Every data page carries a CRC32 of its bytes, which :func:`read_table_file` checks: a file
    damaged after it was written (a disk error, a byte changed by hand) is refused rather than
    read with wrong numbers. Other Parquet readers ignore the checksums.
    """
    atomic_write(path, lambda f: pq.write_table(table, f, compression="zstd", write_page_checksum=True))


def is_data_file(path: Path) -> bool:
    return path.suffix == ".parquet" and not path.name.startswith((".", "_"))


def _type_fits(found: pa.DataType, expected: pa.DataType) -> bool:
    """Whether a column stored as ``found`` holds what :data:`SCHEMA` says, without conversion
    of its kind: integers for an int64 column, floats for a float64 one, text for a string one
    (in any width or encoding another Parquet writer may choose), or all nulls."""
    if pa.types.is_null(found):
        return True
    if pa.types.is_dictionary(found):
        found = found.value_type
    if pa.types.is_boolean(expected):
        return pa.types.is_boolean(found)
    if pa.types.is_integer(expected):
        return pa.types.is_integer(found)
    if pa.types.is_floating(expected):
        return pa.types.is_floating(found)
    return pa.types.is_string(found) or pa.types.is_large_string(found) or str(found) == "string_view"


def damaged(path: Path, reason: str) -> ValueError:
    """The error for a results file that cannot be trusted: it names the file and the remedy."""
    return ValueError(
        f"results file {path} is damaged ({reason}); move it out of the folder (or delete it) and run the same "
        "command again to compute its rows again"
    )


def _run_of(stored: pa.Schema) -> dict[str, Any] | None:
    """The "run" a results file records in its metadata: a part's is the run itself, a merged
    file's is its whole configuration's "run"; None where it records none."""
    raw = (stored.metadata or {}).get(CONFIG_META_KEY)
    if raw is None:
        return None
    try:
        value = json.loads(raw)
    except ValueError:
        return {}  # unreadable: matches no run
    if isinstance(value, dict) and isinstance(value.get("run"), dict):
        return value["run"]
    return value if isinstance(value, dict) else {}


def _other_run(recorded: dict[str, Any], run: dict[str, Any]) -> list[str]:
    """The settings in which a file's recorded run differs from the folder's (those both record,
    so that a setting renamed or added later does not count)."""
    return [
        f"{key}: {str(recorded[key])[:40]} in the file, {str(run[key])[:40]} in config.json"
        for key in run
        if key in recorded and recorded[key] != run[key]
    ]


def read_table_file(
    path: Path, columns: Sequence[str] | None, layout: Layout = ESTIMATE, *, run: dict[str, Any] | None = None
) -> pa.Table:
    """One results file's rows in the layout's columns (all, or ``columns``; default layout:
    :data:`ESTIMATE`).

    Args:
        run: the "run" section of the folder's config.json: a file whose metadata records
            another run (a part copied from another folder) is refused. None: not checked.

    Raises:
        FileNotFoundError: the file is gone (a merge removed it meanwhile).
        ValueError: the file is damaged (unreadable, a page checksum that does not match, a
            column of another type, a row without its key), is not a probust results file, or
            holds rows of another run than ``run``; the message names it.
    """
    full = layout.schema
    schema = full if columns is None else pa.schema([full.field(c) for c in columns])
    try:
        with pq.ParquetFile(path, page_checksum_verification=True) as parquet:
            stored = parquet.schema_arrow
            recorded = _run_of(stored) if run is not None else None
            differs = _other_run(recorded, run) if recorded is not None and run is not None else []
            if differs or recorded == {}:
                raise _ForeignFile("; ".join(differs) or "its record of the run is unreadable")
            table = parquet.read(columns=[c for c in schema.names if c in stored.names])
    except FileNotFoundError:
        raise
    except _ForeignFile as exc:
        raise ValueError(
            f"results file {path} holds rows of another run ({exc}); move it out of the folder (or delete it) "
            "and run the same command again to compute its rows again"
        ) from None
    except Exception as exc:  # disk trouble or a hand edit: name the file
        raise damaged(path, f"cannot read it: {first_line(exc)}") from None
    absent = [name for name in schema.names if name not in stored.names]
    required = [name for name in absent if name not in layout.optional]
    if required:
        raise ValueError(f"results file {path} lacks the columns {required}; it was not written by probust")
    wrong = [
        f"{name} is {stored.field(name).type}, not {full.field(name).type}"
        for name in schema.names
        if name in stored.names and not _type_fits(stored.field(name).type, full.field(name).type)
    ]
    if wrong:
        raise damaged(path, "; ".join(wrong))
    nulls = [name for name in layout.key if name in table.column_names and table.column(name).null_count]
    if nulls:
        raise damaged(path, f"rows without {', '.join(nulls)}")
    # Optional columns a writer left out are null in its rows.
    for name in absent:
        table = table.append_column(schema.field(name), pa.nulls(len(table), schema.field(name).type))
    try:
        return table.select(schema.names).cast(schema).replace_schema_metadata(None)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise damaged(path, first_line(exc)) from None


class _ForeignFile(Exception):
    """A results file whose metadata records another run than its folder's."""


def make_table(columns: dict[str, Any], layout: Layout = ESTIMATE) -> pa.Table:
    """A table of the layout's schema (default :data:`ESTIMATE`'s) from one array per column
    (None, or an optional column left out: all nulls).

    Raises:
        ValueError: unknown or missing columns, or columns of different lengths.
    """
    schema = layout.schema
    unknown = set(columns) - set(schema.names)
    missing = set(schema.names) - set(columns) - set(layout.optional)
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
        for field in schema
    ]
    return pa.Table.from_arrays(arrays, schema=schema)


def to_frame(table: pa.Table, layout: Layout = ESTIMATE) -> Any:
    """The rows as a pandas DataFrame sorted by the layout's key, each key once."""
    frame = table.to_pandas()
    frame = frame.sort_values(list(layout.key), kind="stable")
    # A kill during merge() can leave a row both in a part and in results.parquet.
    frame = frame.drop_duplicates(subset=list(layout.key), keep="first")
    return frame.reset_index(drop=True)
