"""Checks for CIFAR "python version" batch files before torchvision unpickles them.

A CIFAR batch is a pickled dict holding a ``uint8`` array ``data`` of shape [n, 3072] (1024 red,
then 1024 green, then 1024 blue values per image, rows first) and a list of ``n`` labels. The
unpickler here only builds dicts, lists, strings and numpy arrays, so a damaged or hostile file
is refused before torchvision's plain ``pickle.load`` ever sees it.
"""

from __future__ import annotations

import codecs
import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from probust.data._errors import DataCorruptError


def _numpy_globals() -> dict[tuple[str, str], Any]:
    from numpy import dtype, ndarray

    try:  # numpy >= 2 keeps these in numpy._core
        from numpy._core import multiarray, numeric
    except ImportError:  # pragma: no cover - numpy 1.x
        from numpy.core import multiarray, numeric  # type: ignore[no-redef]
    allowed = {}
    # Pickles name the module they were written from: numpy.core (numpy 1, the original CIFAR
    # files) or numpy._core (numpy 2).
    for module in ("numpy.core.multiarray", "numpy._core.multiarray"):
        allowed[(module, "_reconstruct")] = multiarray._reconstruct
        allowed[(module, "scalar")] = multiarray.scalar
    for module in ("numpy.core.numeric", "numpy._core.numeric"):
        allowed[(module, "_frombuffer")] = vars(numeric)["_frombuffer"]
    # Protocol-2 pickles written by Python 3 wrap bytes as _codecs.encode(str, "latin1").
    allowed[("_codecs", "encode")] = codecs.encode
    allowed[("numpy", "ndarray")] = ndarray
    allowed[("numpy", "dtype")] = dtype
    return allowed


class _DataOnlyUnpickler(pickle.Unpickler):
    _allowed = _numpy_globals()

    def find_class(self, module: str, name: str) -> Any:
        try:
            return self._allowed[(module, name)]
        except KeyError:
            raise pickle.UnpicklingError(f"refusing to load global {module}.{name}") from None


def safe_unpickle(path: Path) -> Any:
    """Unpickles ``path`` allowing only plain containers and numpy arrays.

    Raises:
        DataCorruptError: the file is truncated, not a pickle, or names any other global.
    """
    data = path.read_bytes()
    try:
        return _DataOnlyUnpickler(io.BytesIO(data), encoding="latin1").load()
    except Exception as exc:  # pickle raises many types on damaged input
        raise DataCorruptError(f"{path}: not a valid CIFAR pickle ({type(exc).__name__}: {exc})") from None


def check_cifar_batch(path: Path, *, label_key: str, num_classes: int) -> int:
    """Checks one CIFAR batch file's structure; returns its number of images.

    Args:
        path: a batch file (``data_batch_1``, ``test_batch``, ``train``, ``test``).
        label_key: ``"labels"`` for CIFAR-10, ``"fine_labels"`` for CIFAR-100.
        num_classes: labels must lie in ``[0, num_classes)``.

    Raises:
        DataCorruptError: missing keys, wrong dtype or shape, label count or range wrong.
    """
    entry = safe_unpickle(path)
    if not isinstance(entry, dict) or "data" not in entry or label_key not in entry:
        keys = sorted(map(str, entry)) if isinstance(entry, dict) else type(entry).__name__
        raise DataCorruptError(f"{path}: expected a dict with 'data' and '{label_key}', found {keys}")
    data, labels = entry["data"], entry[label_key]
    if not isinstance(data, np.ndarray) or data.dtype != np.uint8 or data.ndim != 2 or data.shape[1] != 3072:
        desc = f"{data.dtype} array of shape {data.shape}" if isinstance(data, np.ndarray) else type(data).__name__
        raise DataCorruptError(f"{path}: 'data' should be a uint8 array of shape [n, 3072], found {desc}")
    labels = np.asarray(labels)
    if labels.shape != (data.shape[0],) or labels.dtype.kind not in "iu":
        raise DataCorruptError(
            f"{path}: {data.shape[0]} images but '{label_key}' holds {labels.shape} {labels.dtype} values"
        )
    if labels.size and (labels.min() < 0 or labels.max() >= num_classes):
        raise DataCorruptError(f"{path}: labels outside [0, {num_classes}): min {labels.min()}, max {labels.max()}")
    return int(data.shape[0])


def check_cifar_meta(path: Path, *, key: str, num_classes: int) -> list[str]:
    """Checks a CIFAR meta file and returns its class names."""
    entry = safe_unpickle(path)
    names = entry.get(key) if isinstance(entry, dict) else None
    if not isinstance(names, list) or len(names) != num_classes or not all(isinstance(n, str) for n in names):
        raise DataCorruptError(f"{path}: expected '{key}' to be a list of {num_classes} class names")
    return names
