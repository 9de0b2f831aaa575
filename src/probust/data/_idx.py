"""Strict reader for IDX files (the MNIST / Fashion-MNIST format), plain or gzip-compressed.

IDX layout: two zero bytes, a type code, the number of dimensions ``nd``, then ``nd``
big-endian uint32 sizes, then the data in row-major order. Every check here exists because
torchvision's own reader accepts a truncated label file (``strict=False``) and reports other
problems with bare ``assert`` statements.
"""

from __future__ import annotations

import gzip
import math
import os
import struct
import zlib
from pathlib import Path

import numpy as np

from probust.data._errors import DataCorruptError

# type code -> (numpy dtype, human name); IDX data are big-endian.
_TYPES: dict[int, tuple[np.dtype, str]] = {
    0x08: (np.dtype(">u1"), "unsigned byte"),
    0x09: (np.dtype(">i1"), "signed byte"),
    0x0B: (np.dtype(">i2"), "int16"),
    0x0C: (np.dtype(">i4"), "int32"),
    0x0D: (np.dtype(">f4"), "float32"),
    0x0E: (np.dtype(">f8"), "float64"),
}
UBYTE = 0x08


def _is_gzip(path: Path) -> bool:
    return path.suffix == ".gz"


def _parse_header(head: bytes, path: Path) -> tuple[int, tuple[int, ...]]:
    """Returns (type code, dims) from the first bytes of an IDX file."""
    if len(head) < 4:
        raise DataCorruptError(f"{path}: file too short for an IDX header ({len(head)} bytes)")
    if head[0] != 0 or head[1] != 0 or head[2] not in _TYPES or not 1 <= head[3] <= 4:
        raise DataCorruptError(
            f"{path}: bad IDX magic number 0x{head[:4].hex()} (expected 0x0000TTNN with a known "
            "type TT and 1-4 dimensions NN); not an IDX file"
        )
    type_code, ndim = head[2], head[3]
    if len(head) < 4 + 4 * ndim:
        raise DataCorruptError(f"{path}: IDX header cut short (needs {4 + 4 * ndim} bytes)")
    dims = struct.unpack(f">{ndim}I", head[4 : 4 + 4 * ndim])
    return type_code, dims


def _check_expectations(path: Path, type_code: int, dims: tuple[int, ...], expect_type: int, expect_ndim: int) -> None:
    if type_code != expect_type:
        raise DataCorruptError(f"{path}: IDX data of type {_TYPES[type_code][1]}, expected {_TYPES[expect_type][1]}")
    if len(dims) != expect_ndim:
        raise DataCorruptError(f"{path}: IDX data has {len(dims)} dimensions, expected {expect_ndim}")


def check_idx_header(path: str | os.PathLike, *, expect_ndim: int, expect_type: int = UBYTE) -> tuple[int, ...]:
    """Checks an uncompressed IDX file's header against its size on disk, without reading the data.

    Args:
        path: an uncompressed IDX file.
        expect_ndim: number of dimensions the caller needs (3 for images, 1 for labels).
        expect_type: IDX type code the caller needs (0x08, unsigned bytes, for MNIST).

    Returns:
        The dimensions recorded in the header.

    Raises:
        DataCorruptError: bad magic number, unexpected type or rank, or a file size that does not
            match the header (truncated, or with trailing bytes).
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4 + 4 * 4)
    type_code, dims = _parse_header(head, path)
    _check_expectations(path, type_code, dims, expect_type, expect_ndim)
    expected = 4 + 4 * len(dims) + math.prod(dims) * _TYPES[type_code][0].itemsize
    actual = path.stat().st_size
    if actual != expected:
        raise DataCorruptError(
            f"{path}: {'truncated' if actual < expected else 'trailing bytes'}: header says shape "
            f"{list(dims)} ({expected} bytes in all), file has {actual} bytes"
        )
    return dims


def read_idx(path: str | os.PathLike, *, expect_ndim: int, expect_type: int = UBYTE) -> np.ndarray:
    """Reads a whole IDX file (``.gz`` is decompressed), checking magic number and size.

    Args:
        path: IDX file, plain or gzip-compressed (by its ``.gz`` suffix).
        expect_ndim: number of dimensions the caller needs.
        expect_type: IDX type code the caller needs.

    Returns:
        The array, shape as recorded in the header, native byte order.

    Raises:
        DataCorruptError: not an IDX file, a broken gzip stream (bad CRC, cut short), an
            unexpected type or rank, or a data size that does not match the header.
    """
    path = Path(path)
    opener = gzip.open if _is_gzip(path) else open
    try:
        with opener(path, "rb") as f:
            head = f.read(4)
            if len(head) == 4 and head[3] <= 4:
                head += f.read(4 * head[3])
            type_code, dims = _parse_header(head, path)
            _check_expectations(path, type_code, dims, expect_type, expect_ndim)
            dtype = _TYPES[type_code][0]
            expected = math.prod(dims) * dtype.itemsize
            # One byte more than needed, so that trailing garbage is noticed too.
            data = f.read(expected + 1)
    except (EOFError, gzip.BadGzipFile, zlib.error) as exc:
        raise DataCorruptError(f"{path}: broken gzip stream ({exc}); the file is truncated or damaged") from None
    if len(data) != expected:
        raise DataCorruptError(
            f"{path}: {'truncated' if len(data) < expected else 'trailing bytes'}: header says shape "
            f"{list(dims)} ({expected} data bytes), file has "
            f"{len(data) if len(data) <= expected else 'more'}"
        )
    return np.frombuffer(data, dtype=dtype).astype(dtype.newbyteorder("="), copy=True).reshape(dims)
