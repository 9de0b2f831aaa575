"""MNIST and Fashion-MNIST: IDX files in torchvision's layout, a flat folder, or gzip-compressed.

Uncompressed files are read by torchvision's own MNIST reader after a strict header/size check;
``.gz`` files (what Debian ships, and what torchvision downloads before extracting) are read by
:func:`probust.data._idx.read_idx`. Downloads go through torchvision.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from probust._extras import import_extra
from probust.data._dataset import ImageDataset
from probust.data._errors import DataCorruptError, ProbustDataError
from probust.data._idx import check_idx_header, read_idx
from probust.data._locate import dedupe, not_found, search_roots
from probust.errors import Setting

# torchvision's class per data set (imported on use: torchvision is the 'data' extra).
_TV_NAMES = {"mnist": "MNIST", "fashion-mnist": "FashionMNIST"}
_STATS = {  # training-split mean and std, pixel units
    "mnist": ((0.1307,), (0.3081,)),
    "fashion-mnist": ((0.2860,), (0.3530,)),
}


def _tv_class(name: str) -> Any:
    datasets = import_extra("torchvision.datasets", extra="data", feature=f"the {name} data set")
    return getattr(datasets, _TV_NAMES[name])


def _stems(split: str) -> tuple[str, str]:
    prefix = "train" if split == "train" else "t10k"
    return f"{prefix}-images-idx3-ubyte", f"{prefix}-labels-idx1-ubyte"


def _candidate_dirs(name: str, root: Path) -> list[Path]:
    # torchvision's layout first (what --download produces), then a flat folder (Debian's).
    return dedupe([root / _TV_NAMES[name] / "raw", root, root / name])


def _find(name: str, split: str, roots: list[Path]) -> tuple[Path, Path] | list[str]:
    """Returns (images file, labels file) from the first folder holding both, else notes."""
    notes = []
    for root in roots:
        for folder in _candidate_dirs(name, root):
            found = []
            for stem in _stems(split):
                # An uncompressed file wins: torchvision reads it directly.
                hit = next((folder / f for f in (stem, stem + ".gz") if (folder / f).is_file()), None)
                found.append(hit)
            if all(found):
                return found[0], found[1]  # type: ignore[return-value]
            if any(found):
                have = [p.name for p in found if p]
                notes.append(f"in {folder}: found {', '.join(have)} but not its companion file")
    return notes


def _read_with_torchvision(name: str, split: str, folder: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """torchvision's MNIST reader pointed at one folder of uncompressed IDX files."""

    class _FolderMNIST(_tv_class(name)):  # type: ignore[misc]
        # torchvision derives its folder from root and the class name; use the one found.
        raw_folder = str(folder)

        def _check_legacy_exist(self) -> bool:
            return False

        def _check_exists(self) -> bool:
            return all((folder / s).is_file() for s in _stems(split))

    ds = _FolderMNIST(root=str(folder), train=split == "train", download=False)
    return ds.data, ds.targets


def _read_pair(name: str, split: str, images_path: Path, labels_path: Path) -> tuple[torch.Tensor, torch.Tensor]:
    """Reads and checks one split; returns images uint8 [N, 1, 28, 28] and labels int64 [N]."""
    compressed = images_path.suffix == ".gz" or labels_path.suffix == ".gz"
    if compressed:
        images = torch.from_numpy(read_idx(images_path, expect_ndim=3))
        labels = torch.from_numpy(read_idx(labels_path, expect_ndim=1)).to(torch.int64)
        img_dims, lab_dims = tuple(images.shape), tuple(labels.shape)
    else:  # header and size checked here, data read by torchvision
        img_dims = check_idx_header(images_path, expect_ndim=3)
        lab_dims = check_idx_header(labels_path, expect_ndim=1)
    if tuple(img_dims[1:]) != (28, 28):
        raise DataCorruptError(f"{images_path}: images of size {list(img_dims[1:])}, expected 28x28")
    if img_dims[0] != lab_dims[0]:
        raise DataCorruptError(f"{images_path} holds {img_dims[0]} images but {labels_path} holds {lab_dims[0]} labels")
    if not compressed:
        images, labels = _read_with_torchvision(name, split, images_path.parent)
    if labels.numel() and (labels.min() < 0 or labels.max() > 9):
        raise DataCorruptError(f"{labels_path}: labels outside [0, 9]: min {labels.min()}, max {labels.max()}")
    return images.unsqueeze(1).contiguous(), labels.to(torch.int64)


def _download(name: str, root: Path) -> None:
    root.mkdir(parents=True, exist_ok=True)
    _tv_class(name)(root=str(root), train=True, download=True)


def load_idx_dataset(name: str, split: str, root: str | None, download: bool) -> ImageDataset:
    """Loads MNIST or Fashion-MNIST; see :func:`probust.data.load`."""
    roots = search_roots(name, root)
    found = _find(name, split, roots)
    download_error = None
    if isinstance(found, list) and download:
        try:
            _download(name, roots[0])
        except Exception as exc:  # network, HTTP, disk: all reported the same way
            download_error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}"
        found = _find(name, split, roots)
    if isinstance(found, list):
        looked = [d for r in roots for d in _candidate_dirs(name, r)]
        raise not_found(
            name,
            split,
            [f"{s}[.gz]" for s in _stems(split)],
            looked,
            roots[0],
            notes=found,
            download_error=download_error,
        )
    images_path, labels_path = found
    try:
        images, labels = _read_pair(name, split, images_path, labels_path)
    except ProbustDataError as exc:
        raise type(exc)(
            *exc.parts,
            "\n(delete the damaged file and run again with ",
            Setting("download", True),
            ", or reinstall it)",
            field=exc.field,
            path=exc.path,
        ) from None
    mean, std = _STATS[name]
    return ImageDataset(
        images,
        labels,
        name=name,
        split=split,
        classes=list(_tv_class(name).classes),
        mean=mean,
        std=std,
        source=str(images_path.parent),
    )
