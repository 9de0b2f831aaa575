"""A results store held in memory (:func:`probust.score` without ``out``)."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pyarrow as pa

from probust.run.files import ESTIMATE, Layout, make_table
from probust.run.store import MEMORY, ResultStore

__all__ = ["MemoryStore"]


class MemoryStore(ResultStore):
    """A results store held in memory (:func:`probust.score` without ``out``): the work units'
    parts are Arrow tables of the layout's schema, the types a folder's files hold, so
    :meth:`read` gives the same frame as :func:`read_results` on a folder of the same rows. There
    is no folder: no files, no lock, no history, nothing to resume.

    Every method of :class:`ResultStore` that would touch the disk is overridden; ``path`` is
    only a name (:data:`MEMORY`), never written to.

    Args:
        layout: the table it holds (default ``probust estimate``'s).
    """

    def __init__(self, layout: Layout = ESTIMATE) -> None:
        super().__init__(MEMORY, layout)
        self._parts: list[pa.Table] = []
        self._config: dict[str, Any] | None = None

    @property
    def config_path(self) -> Path:
        raise RuntimeError("a MemoryStore has no folder")

    @property
    def parts_dir(self) -> Path:
        raise RuntimeError("a MemoryStore has no folder")

    @property
    def merged_path(self) -> Path:
        raise RuntimeError("a MemoryStore has no folder")

    def create(self) -> None:
        pass

    def data_files(self) -> list[Path]:
        return []

    def has_results(self) -> bool:
        return bool(self._parts)

    def clear(self) -> None:
        self._parts, self._config = [], None

    def remove_temporaries(self) -> int:
        return 0

    def refuse_links(self) -> None:
        pass  # no folder

    def _own(self, path: Path, what: str) -> None:
        pass

    def _run(self) -> dict[str, Any] | None:
        return None  # its parts are this process's own

    def acquire_lock(self) -> None:
        pass  # one process owns the object

    def release_lock(self) -> None:
        pass

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        yield

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        yield

    def read_config(self) -> dict[str, Any] | None:
        return self._config

    def write_config(self, config: dict[str, Any]) -> None:
        self._config = config

    def write_part(self, name: str, columns: dict[str, Any], metadata: dict[str, Any] | None = None) -> Path:
        """Keep one work unit's rows (``metadata`` is dropped: the run's configuration is
        :meth:`read_config`'s); returns the part's name under :data:`MEMORY`."""
        self._parts.append(make_table(columns, self.layout))
        return self.path / name

    def _read(self, columns: Sequence[str] | None) -> pa.Table:
        full = self.layout.schema
        schema = full if columns is None else pa.schema([full.field(c) for c in columns])
        if not self._parts:
            return schema.empty_table()
        return pa.concat_tables(self._parts).select(schema.names)

    def merge(self, config: dict[str, Any] | None = None, frame: Any = None) -> Path:
        """Nothing to compact: the rows stay as they are (returns :data:`MEMORY`)."""
        if config is not None:
            self._config = config
        return self.path
