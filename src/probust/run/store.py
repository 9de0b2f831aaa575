"""The results table on disk: Parquet parts written atomically, resumable, readable mid-run.

A results folder holds::

    OUT/
      config.json        the run's configuration (data, model hash, grid, seed, versions), once
      parts/*.parquet    one file per completed work unit, each appearing atomically
      results.parquet    all rows in one file, after :func:`merge` (parts are then removed)
      .lock              held by the process writing into the folder (released by the
                         operating system when that process ends, even by SIGKILL)

probust writes, truncates and deletes only inside the folder: a ``parts/``, ``.lock``,
``config.json``, ``results.parquet`` or part that is a symbolic link is refused by name
(:class:`ResultsLinkError`) before anything is written, the lock is opened with ``O_NOFOLLOW``
and must be a plain file of its own. Reading a folder through links is allowed.

Every part is written to a hidden temporary name in ``parts/``, flushed to disk and then
``os.replace``d into place, so a reader (or a resumed run) sees a whole part or none of it,
whatever kills the writer; a write that fails (a full disk) raises :class:`ResultsWriteError`
naming the folder and leaves it as it was. Each data page carries a checksum, so a file
damaged later is refused by name rather than read with other numbers, and so is a file whose
metadata says another run wrote it (a part copied in from another folder). :func:`probust.run.reading.read_results`
reads either layout, or both at once.

The folder's ``config.json`` says which run made the rows; it is marked ``"format":``
:data:`FORMAT` (version :data:`FORMAT_VERSION`). :func:`probust.run.reading.read_config` gives
it as written (a dict); :func:`probust.run.results_config.read_results_config` reads it typed.
:class:`~probust.run.memory_store.MemoryStore` holds the same table in memory.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import stat
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from probust._io import atomic_write_bytes
from probust.errors import ProbustError, first_line
from probust.run.files import (
    CONFIG_META_KEY,
    ESTIMATE,
    KEY,
    OPTIONAL_COLUMNS,
    SCHEMA,
    Layout,
    atomic_write_table,
    is_data_file,
    make_table,
    read_table_file,
    to_frame,
)

__all__ = [
    "CONFIG_NAME",
    "FORMAT",
    "FORMAT_VERSION",
    "KEY",
    "MEMORY",
    "MERGED_NAME",
    "OPTIONAL_COLUMNS",
    "PARTS_DIR",
    "SCHEMA",
    "FolderLockedError",
    "ResultStore",
    "ResultsLinkError",
    "ResultsWriteError",
    "make_table",
    "merge",
]

#: The ``"format"`` of a results folder's ``config.json``: what marks a folder as probust's
#: (``probust estimate``'s; ``probust certify``'s folders are marked by their own layout's).
FORMAT = ESTIMATE.format
#: The version of that format this code writes (also of ``probust certify``'s table); a folder
#: of another version is read by the release that wrote it.
FORMAT_VERSION = 2
CONFIG_NAME = "config.json"
PARTS_DIR = "parts"
MERGED_NAME = "results.parquet"
_LOCK_NAME = ".lock"
#: The name a :class:`MemoryStore` has where a :class:`ResultStore` has its folder (no file is
#: ever written under it).
MEMORY = Path("<memory>")


class FolderLockedError(ProbustError, RuntimeError):
    """Another process holds the results folder's lock."""


class ResultsLinkError(ProbustError, OSError):
    """A file or folder that probust would write, truncate or delete in a results folder is a
    symbolic link (or, for the lock, not a plain file of its own): following it would change
    something outside the folder, so nothing is written. The message names it."""


class ResultsWriteError(ProbustError, OSError):
    """A file of a results folder could not be written (a full disk, a quota, an I/O error).

    The file was written whole or not at all, so the folder is as it was before the attempt:
    every row already stored reads, and the same run started again computes the rest.
    ``errno`` and ``strerror`` are the failure's.
    """

    def __str__(self) -> str:
        return str(self.args[0])


class ResultStore:
    """One results folder: its configuration, its parts, and their merged form.

    Args:
        path: the folder (created by :meth:`create`, not by the constructor).
        layout: the table it holds (default ``probust estimate``'s).
    """

    def __init__(self, path: str | os.PathLike, layout: Layout = ESTIMATE) -> None:
        self.path = Path(path)
        self.layout = layout
        self._lock_fd: int | None = None

    @property
    def config_path(self) -> Path:
        return self.path / CONFIG_NAME

    @property
    def parts_dir(self) -> Path:
        return self.path / PARTS_DIR

    @property
    def merged_path(self) -> Path:
        return self.path / MERGED_NAME

    # -- folder ------------------------------------------------------------------------------

    def create(self) -> None:
        """Create the folder and its ``parts/`` subfolder (OSError if that is impossible).

        Raises:
            ResultsLinkError: a file or folder probust writes there is a symbolic link
                (:meth:`refuse_links`).
        """
        self.path.mkdir(parents=True, exist_ok=True)
        self._own(self.parts_dir, "its parts folder")
        self.parts_dir.mkdir(exist_ok=True)
        self.refuse_links()

    def _own(self, path: Path, what: str) -> None:
        """Raise :class:`ResultsLinkError` if ``path`` (in the folder) is a symbolic link."""
        if path.is_symlink():
            try:
                target = f" to {os.readlink(path)}"
            except OSError:  # pragma: no cover - gone meanwhile
                target = ""
            raise ResultsLinkError(
                f"{path} ({what}) is a symbolic link{target}; probust writes and deletes only inside {self.path}, "
                "never through a link: remove the link (or choose another output folder)"
            )

    def refuse_links(self) -> None:
        """Refuse a folder in which writing or deleting would follow a symbolic link out of it:
        ``parts/``, ``.lock``, ``config.json``, ``results.parquet`` and every file in ``parts/``
        must be the folder's own (the folder itself may be reached through a link).

        Raises:
            ResultsLinkError: naming the link.
        """
        self._own(self.parts_dir, "its parts folder")
        own = self.path.resolve()
        if self.parts_dir.exists() and self.parts_dir.resolve() != own / PARTS_DIR:
            raise ResultsLinkError(
                f"{self.parts_dir} resolves to {self.parts_dir.resolve()}, outside {own}; probust writes and "
                "deletes only inside the folder: choose another output folder"
            )
        for path, what in (
            (self.path / _LOCK_NAME, "its lock"),
            (self.config_path, "its configuration"),
            (self.merged_path, "its results file"),
        ):
            self._own(path, what)
        if self.parts_dir.is_dir():
            for path in self.parts_dir.iterdir():
                self._own(path, "a results part")

    def data_files(self) -> list[Path]:
        """Every file holding rows: ``results.parquet`` first, then the parts by name."""
        files = [self.merged_path] if self.merged_path.is_file() else []
        if self.parts_dir.is_dir():
            files += sorted(p for p in self.parts_dir.iterdir() if is_data_file(p))
        return files

    def has_results(self) -> bool:
        return bool(self.data_files())

    def clear(self) -> None:
        """Remove what probust wrote here (config, parts, merged table); other files are kept.

        Raises:
            ResultsLinkError: deleting would follow a symbolic link (:meth:`refuse_links`).
        """
        self.refuse_links()
        for path in self.data_files():
            path.unlink(missing_ok=True)
        self.remove_temporaries()
        self.config_path.unlink(missing_ok=True)

    def remove_temporaries(self) -> int:
        """Delete half-written files left by a killed writer; returns how many there were.

        Only call this while no process writes into the folder.

        Raises:
            ResultsLinkError: ``parts/`` is a symbolic link.
        """
        self._own(self.parts_dir, "its parts folder")
        removed = 0
        for folder in (self.path, self.parts_dir):
            if folder.is_dir():
                for p in folder.iterdir():
                    if p.name.startswith(".") and p.name.endswith(".tmp"):
                        p.unlink(missing_ok=True)
                        removed += 1
        return removed

    def acquire_lock(self) -> None:
        """Take the folder's lock, so two runs cannot write into it at once; the folder must
        exist. Held until :meth:`release_lock` or the process ends (even by SIGKILL).

        The lock file is opened without following a link, and must be a plain file with no other
        name (a hard link): its contents are replaced by this process's id.

        Raises:
            FolderLockedError: another process holds it.
            ResultsLinkError: ``.lock`` is a symbolic link, or not a plain file of its own.
        """
        if self._lock_fd is not None:
            return
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no advisory locks
            return
        lock = self.path / _LOCK_NAME
        try:
            fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
        except OSError as exc:
            if exc.errno != errno.ELOOP:
                raise
            self._own(lock, "its lock")
            raise
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_nlink > 1:
            os.close(fd)
            kind = "a plain file" if stat.S_ISREG(info.st_mode) else "not a plain file"
            raise ResultsLinkError(
                f"{lock} (its lock) is {kind}{' with another name (a hard link)' if info.st_nlink > 1 else ''}; "
                "probust writes its process id there: remove it (or choose another output folder)"
            )
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 200, 0).decode(errors="replace").strip() or "another process"
            os.close(fd)
            raise FolderLockedError(
                f"{self.path} is being written by another run ({other}); wait for it, or choose another output folder"
            ) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {os.uname().nodename}".encode(), 0)
        self._lock_fd = fd

    def release_lock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)  # closing the descriptor releases the lock
            self._lock_fd = None

    @contextlib.contextmanager
    def lock(self) -> Iterator[None]:
        """:meth:`acquire_lock` for the duration of a ``with`` block."""
        self.acquire_lock()
        try:
            yield
        finally:
            self.release_lock()

    @contextlib.contextmanager
    def _writing(self, path: Path) -> Iterator[None]:
        """Turn an OSError while writing ``path`` into a one-line :class:`ResultsWriteError`
        naming the folder."""
        try:
            yield
        except ResultsWriteError:
            raise
        except OSError as exc:
            where = path.relative_to(self.path) if path.is_relative_to(self.path) else path
            error = ResultsWriteError(
                f"cannot write to {self.path} ({exc.strerror or first_line(exc)}, writing {where}); the rows "
                "already there are kept: make room (or fix the disk) and run the same command again for the rest"
            )
            error.errno, error.strerror = exc.errno, exc.strerror
            raise error from exc

    # -- configuration -----------------------------------------------------------------------

    def read_config(self) -> dict[str, Any] | None:
        """The folder's ``config.json``, or None when there is none."""
        try:
            text = self.config_path.read_text()
        except FileNotFoundError:
            return None
        try:
            return json.loads(text)
        except ValueError as exc:
            raise ValueError(f"{self.config_path} is not valid JSON ({exc})") from None

    def write_config(self, config: dict[str, Any]) -> None:
        """Write ``config.json`` atomically.

        Raises:
            ResultsWriteError: it could not be written (the old one is then intact).
        """
        with self._writing(self.config_path):
            atomic_write_bytes(self.config_path, (json.dumps(config, indent=2, sort_keys=False) + "\n").encode())

    # -- rows --------------------------------------------------------------------------------

    def write_part(self, name: str, columns: dict[str, Any], metadata: dict[str, Any] | None = None) -> Path:
        """Write one work unit's rows as ``parts/<name>.parquet``, atomically.

        Args:
            name: a file stem unique to the work unit (no folder, no suffix).
            columns: one array (or list) per column of the layout's schema, all the same
                length; None for a column with no value in this unit (written as nulls). Its
                optional columns may be left out (nulls too).
            metadata: JSON-serialisable, kept in the file's key-value metadata.

        Returns:
            The path of the part.

        Raises:
            ResultsWriteError: it could not be written (nothing is then left of it).
        """
        table = make_table(columns, self.layout)
        if metadata is not None:
            table = table.replace_schema_metadata({CONFIG_META_KEY: json.dumps(metadata).encode()})
        self._own(self.parts_dir, "its parts folder")
        path = self.parts_dir / f"{name}.parquet"
        if path.exists():  # never overwrite rows that are already there
            path = self.parts_dir / f"{name}-{os.getpid()}-{time.monotonic_ns()}.parquet"
        with self._writing(path):
            atomic_write_table(path, table)
        return path

    def _run(self) -> dict[str, Any] | None:
        """The "run" section of the folder's config.json (None without one), against which each
        file's own record of its run is checked (:func:`~probust.run.files.read_table_file`)."""
        try:
            config = self.read_config()
        except ValueError:
            return None  # a damaged config.json is refused where the folder is claimed
        run = config.get("run") if isinstance(config, dict) else None
        return run if isinstance(run, dict) else None

    def _read(self, columns: Sequence[str] | None) -> pa.Table:
        # A concurrent merge() may delete parts between listing and reading them; their rows are
        # then in results.parquet, so list again.
        run = self._run()
        for attempt in range(10):
            files = self.data_files()
            try:
                tables = [read_table_file(p, columns, self.layout, run=run) for p in files]
            except FileNotFoundError:
                time.sleep(0.05 * (attempt + 1))
                continue
            if not tables:
                full = self.layout.schema
                schema = full if columns is None else pa.schema([full.field(c) for c in columns])
                return schema.empty_table()
            return pa.concat_tables(tables)
        raise RuntimeError(f"{self.path}: parts kept disappearing while being read (a merge running?)")

    def read(self) -> Any:
        """All rows as a pandas DataFrame; see :func:`read_results`."""
        return to_frame(self._read(None), self.layout)

    def completed(self, frame: Any = None) -> dict[tuple[Any, ...], np.ndarray]:
        """The point indices already stored for each task of the grid (the layout's key without
        the index: (sigma, method, n_samples) for ``probust estimate``): sorted int64.

        Args:
            frame: rows already read with :meth:`read` (saves reading the folder again).
        """
        layout = self.layout
        if frame is None:
            frame = self._read(layout.key).to_pandas()
        if len(frame) == 0:
            return {}
        grid = list(layout.grid_key)
        kinds = [_python_type(layout.schema.field(name).type) for name in grid]
        done: dict[tuple[Any, ...], np.ndarray] = {}
        for values, group in frame.groupby(grid, sort=False):
            values = values if isinstance(values, tuple) else (values,)
            key = tuple(kind(v) for kind, v in zip(kinds, values, strict=True))
            done[key] = np.unique(group[layout.key[0]].to_numpy(np.int64))
        return done

    def merge(self, config: dict[str, Any] | None = None, frame: Any = None) -> Path:
        """Compact every row into ``results.parquet`` and delete the parts; see :func:`merge`.

        Args:
            config: kept in the file's metadata; default ``config.json``.
            frame: every row, as :meth:`read` just gave it (saves reading the folder again).

        Raises:
            ResultsWriteError: ``results.parquet`` could not be written (the parts are then kept).
            ResultsLinkError: writing or deleting would follow a symbolic link (:meth:`refuse_links`).
        """
        self.refuse_links()
        files = self.data_files()
        parts = [p for p in files if p != self.merged_path]
        if not parts and self.merged_path.is_file():
            return self.merged_path
        frame = self.read() if frame is None else frame
        table = pa.Table.from_pandas(frame, schema=self.layout.schema, preserve_index=False)
        config = config if config is not None else self.read_config()
        if config is not None:
            table = table.replace_schema_metadata({CONFIG_META_KEY: json.dumps(config).encode()})
        with self._writing(self.merged_path):
            self.path.mkdir(parents=True, exist_ok=True)
            atomic_write_table(self.merged_path, table)
        # Only now that every row is safely in results.parquet may the parts go; a kill in
        # between leaves duplicates, which readers drop.
        for p in parts:
            p.unlink(missing_ok=True)
        return self.merged_path


def _python_type(kind: pa.DataType) -> Any:
    """The Python type a key column's values are compared as."""
    if pa.types.is_integer(kind):
        return int
    if pa.types.is_floating(kind):
        return float
    return str


def merge(path: str | os.PathLike) -> Path:
    """Compact a results folder's parts into one ``results.parquet`` (with the configuration
    in its key-value metadata) and delete the parts. Safe to interrupt: rows are never lost.

    A run merges its folder itself at the end, unless asked not to (``--no-merge``).

    Returns:
        The path of ``results.parquet``.

    Raises:
        FolderLockedError: a run is writing into the folder.
    """
    store = ResultStore(path)
    if not store.path.is_dir():
        raise FileNotFoundError(f"no results folder at {path}")
    with store.lock():
        return store.merge()
