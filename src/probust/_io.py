"""Files written whole or not at all, file digests, and one-line error texts.

Every file probust writes for others to read (results parts, config.json, checkpoints, the
report, the plan cache) goes through :func:`atomic_write`: a reader sees the old file or the new
one, never a partial one, whatever happens mid-write (an exception, a kill, a full disk).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import IO


def fsync_dir(path: str | os.PathLike) -> None:
    """Flush a folder's entries (a rename into it) to the disk, where the platform allows."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:  # pragma: no cover - platforms without directory fds
        return
    try:
        os.fsync(fd)
    except OSError:  # pragma: no cover
        pass
    finally:
        os.close(fd)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


# mkstemp creates files readable by the owner only; what probust writes is shared like any file.
_FILE_MODE = 0o666 & ~_umask()


def atomic_write(path: str | os.PathLike, write: Callable[[IO[bytes]], object], *, durable: bool = True) -> None:
    """Write ``path`` through a temporary file in the same folder and ``os.replace``.

    Args:
        path: the file to (re)place; its folder is created if missing.
        write: called once with the temporary file, open for binary writing.
        durable: fsync the file and the folder, so the new file survives a power loss too.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        if hasattr(os, "fchmod"):
            os.fchmod(fd, _FILE_MODE)
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = True) -> None:
    """:func:`atomic_write` of ``data``."""
    atomic_write(path, lambda f: f.write(data), durable=durable)


def atomic_write_text(path: str | os.PathLike, text: str, *, durable: bool = True) -> None:
    """:func:`atomic_write` of ``text`` in UTF-8."""
    atomic_write_bytes(path, text.encode("utf-8"), durable=durable)


def sha256_file(path: str | os.PathLike, block: int = 1 << 20) -> str:
    """The sha256 of a file's bytes, as 64 hex digits."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(block), b""):
            h.update(chunk)
    return h.hexdigest()
