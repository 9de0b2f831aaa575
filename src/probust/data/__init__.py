"""Data sets for probust: MNIST, Fashion-MNIST, CIFAR-10, CIFAR-100 and scikit-learn's digits.

Every data set comes back as an :class:`ImageDataset` whose items are ``(x, label)`` with ``x``
float32 ``[C, H, W]`` in [0, 1] (pixel units: noise ``sigma`` is measured on this scale) and
``label`` an ``int``.

Files are looked for offline first, in this order:

1. ``root`` if given, else ``$PROBUST_DATA_DIR``, else ``~/.cache/probust/data``. Under it, torchvision's
   layout (``FashionMNIST/raw/``, ``cifar-10-batches-py/``) or the files directly, plain or ``.gz``.
2. Folders where system packages put them (Debian's ``dataset-fashion-mnist``:
   ``/usr/share/datasets/fashion-mnist``).

A user's own data (:func:`load_file`, :class:`FileOptions`): a tensor file (``.npz``, ``.pt``,
``.npy``), a table (Parquet, CSV) or a folder of images in class subfolders.

Only with ``download=True`` is anything fetched (by torchvision, into the first folder). Every
file is checked (IDX magic number and size; CIFAR pickle structure) before it is used.

Example:
    >>> ds = probust.data.load("fashion-mnist", split="test")
    >>> x, y = ds[0]              # x: float32 [1, 28, 28] in [0, 1]
    >>> X, Y = ds.tensors()       # X: float32 [10000, 1, 28, 28], Y: int64 [10000]
"""

from __future__ import annotations

import os

from probust.data._cifar import load_cifar_dataset
from probust.data._dataset import ImageDataset
from probust.data._digits import load_digits_dataset
from probust.data._errors import DataCorruptError, DataFormatError, ProbustDataError
from probust.data._files import TABLE_SUFFIXES, TENSOR_SUFFIXES, FileOptions, load_file
from probust.data._folder import IMAGE_EXTENSIONS, ImageFolderDataset, read_image_folder
from probust.data._locate import DATA_DIR_ENV, SYSTEM_DIRS, data_home
from probust.data._mnist import load_idx_dataset
from probust.data._tensors import TensorDataset

__all__ = [
    "DATASETS",
    "DATA_DIR_ENV",
    "SYSTEM_DIRS",
    "IMAGE_EXTENSIONS",
    "TABLE_SUFFIXES",
    "TENSOR_SUFFIXES",
    "DataCorruptError",
    "DataFormatError",
    "FileOptions",
    "ImageDataset",
    "ImageFolderDataset",
    "ProbustDataError",
    "TensorDataset",
    "canonical_name",
    "data_home",
    "is_builtin",
    "load",
    "load_file",
    "read_image_folder",
]

#: The data set names :func:`load` knows.
DATASETS: tuple[str, ...] = ("mnist", "fashion-mnist", "cifar10", "cifar100", "digits")

_ALIASES = {
    "fmnist": "fashion-mnist",
    "fashion_mnist": "fashion-mnist",
    "fashionmnist": "fashion-mnist",
    "cifar-10": "cifar10",
    "cifar_10": "cifar10",
    "cifar-100": "cifar100",
    "cifar_100": "cifar100",
}
SPLITS = ("train", "test")


def canonical_name(name: str) -> str:
    """The canonical data set name for ``name`` (case and common spellings forgiven).

    Raises:
        ValueError: an unknown name; the message lists the known ones.
    """
    key = str(name).strip().lower()
    key = _ALIASES.get(key, key)
    if key not in DATASETS:
        raise ValueError(f"unknown data set {name!r}; known data sets: {', '.join(DATASETS)}")
    return key


def is_builtin(data: str | os.PathLike) -> bool:
    """Whether ``data`` names a built-in data set (:data:`DATASETS`, spellings forgiven) rather
    than a file or folder: a name with a path separator (``./digits``) is always a path."""
    text = os.fspath(data)
    if "/" in text or os.sep in text:
        return False
    try:
        canonical_name(text)
    except ValueError:
        return False
    return True


def load(
    name: str,
    split: str = "test",
    root: str | os.PathLike | None = None,
    download: bool = False,
) -> ImageDataset:
    """Loads a data set split into memory.

    Args:
        name: one of :data:`DATASETS` (``"fmnist"``, ``"cifar-10"`` and similar spellings accepted).
        split: ``"train"`` or ``"test"``.
        root: folder to look in first, and to download into; default ``$PROBUST_DATA_DIR`` or
            ``~/.cache/probust/data``.
        download: fetch the files (through torchvision) when they are not found locally.

    Returns:
        An :class:`ImageDataset`: ``ds[i] -> (x float32 [C, H, W] in [0, 1], label int)``, with
        ``classes``, ``name``, ``input_shape``, ``num_classes`` and ``tensors()``.

    Raises:
        ValueError: unknown ``name`` or ``split``.
        ProbustDataError: the files are missing (the message names them, where they were looked
            for, and how to get them) or could not be downloaded.
        DataCorruptError: a file is truncated or not in the expected format.
    """
    key = canonical_name(name)
    if split not in SPLITS:
        raise ValueError(f"unknown split {split!r}; expected one of: {', '.join(SPLITS)}")
    root_str = os.fspath(root) if root is not None else None
    if key == "digits":
        return load_digits_dataset(split)
    if key in ("mnist", "fashion-mnist"):
        return load_idx_dataset(key, split, root_str, download)
    return load_cifar_dataset(key, split, root_str, download)
