"""CIFAR-10 and CIFAR-100 from the "python version" batch files, read by torchvision.

Every file is first checked by :mod:`probust.data._pickle` (structure, sizes, labels; only
data-like pickles accepted); torchvision's reader then loads them. torchvision also checks MD5
sums of the official files; that check is replaced by the structural one so that small files in
the same format (tests, subsets) load through the same code.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from probust._extras import import_extra
from probust.data._dataset import ImageDataset
from probust.data._errors import ProbustDataError
from probust.data._locate import dedupe, not_found, search_roots
from probust.data._pickle import check_cifar_batch, check_cifar_meta
from probust.errors import Part, Setting


@dataclass(frozen=True)
class _CifarFormat:
    tv_name: str  # torchvision's class (imported on use: torchvision is the 'data' extra)
    label_key: str
    meta_key: str
    num_classes: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]

    @property
    def tv_class(self) -> Any:
        datasets = import_extra("torchvision.datasets", extra="data", feature=f"the {self.tv_name} data set")
        return getattr(datasets, self.tv_name)

    @property
    def folder(self) -> str:
        return self.tv_class.base_folder

    def files(self, split: str) -> list[str]:
        listing = self.tv_class.train_list if split == "train" else self.tv_class.test_list
        return [f for f, _md5 in listing]

    @property
    def meta_file(self) -> str:
        return self.tv_class.meta["filename"]


_FORMATS = {
    "cifar10": _CifarFormat(
        "CIFAR10",
        "labels",
        "label_names",
        10,
        (0.4914, 0.4822, 0.4465),
        (0.2470, 0.2435, 0.2616),
    ),
    "cifar100": _CifarFormat(
        "CIFAR100",
        "fine_labels",
        "fine_label_names",
        100,
        (0.5071, 0.4865, 0.4409),
        (0.2673, 0.2564, 0.2762),
    ),
}


def _candidate_dirs(fmt: _CifarFormat, root: Path) -> list[Path]:
    # torchvision's layout (root/cifar-10-batches-py), or root being that folder itself.
    return dedupe([root / fmt.folder, root])


def _find(fmt: _CifarFormat, split: str, roots: list[Path]) -> Path | list[str | tuple[Part, ...]]:
    needed = fmt.files(split) + [fmt.meta_file]
    notes: list[str | tuple[Part, ...]] = []
    for root in roots:
        for folder in _candidate_dirs(fmt, root):
            have = [f for f in needed if (folder / f).is_file()]
            if len(have) == len(needed):
                return folder
            if have:
                notes.append(
                    f"in {folder}: found {', '.join(have)} but not {', '.join(sorted(set(needed) - set(have)))}"
                )
        archive = root / fmt.tv_class.filename
        if archive.is_file():
            notes.append(
                (
                    f"found the archive {archive}: ",
                    Setting("download", True),
                    " verifies and extracts it without a network",
                )
            )
    return notes


def _torchvision_reader(fmt: _CifarFormat, folder: Path, split: str) -> Any:
    base = fmt.tv_class

    class _CheckedCIFAR(base):  # type: ignore[misc, valid-type]
        base_folder = folder.name
        meta = {**base.meta, "md5": None}  # structure already checked; None = existence only

        def _check_integrity(self) -> bool:
            return all((folder / f).is_file() for f in fmt.files(split))

    return _CheckedCIFAR(root=str(folder.parent), train=split == "train", download=False)


def load_cifar_dataset(name: str, split: str, root: str | None, download: bool) -> ImageDataset:
    """Loads CIFAR-10 or CIFAR-100; see :func:`probust.data.load`."""
    fmt = _FORMATS[name]
    roots = search_roots(name, root)
    found = _find(fmt, split, roots)
    download_error = None
    if isinstance(found, list) and download:
        try:
            roots[0].mkdir(parents=True, exist_ok=True)
            fmt.tv_class(root=str(roots[0]), train=split == "train", download=True)
        except Exception as exc:  # network, HTTP, MD5, disk: all reported the same way
            text = str(exc).strip()
            download_error = f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}"
        found = _find(fmt, split, roots)
    if isinstance(found, list):
        looked = [d for r in roots for d in _candidate_dirs(fmt, r)]
        raise not_found(name, split, fmt.files(split) + [fmt.meta_file], looked, roots[0], found, download_error)
    folder = found
    try:
        n = sum(
            check_cifar_batch(folder / f, label_key=fmt.label_key, num_classes=fmt.num_classes)
            for f in fmt.files(split)
        )
        classes = check_cifar_meta(folder / fmt.meta_file, key=fmt.meta_key, num_classes=fmt.num_classes)
    except ProbustDataError as exc:
        raise type(exc)(
            *exc.parts,
            "\n(delete the damaged file and run again with ",
            Setting("download", True),
            ")",
            field=exc.field,
            path=exc.path,
        ) from None
    ds = _torchvision_reader(fmt, folder, split)
    images = torch.from_numpy(ds.data).permute(0, 3, 1, 2).contiguous()  # torchvision keeps HWC
    targets = torch.as_tensor(ds.targets, dtype=torch.int64)
    assert images.shape == (n, 3, 32, 32) and list(ds.classes) == classes
    return ImageDataset(
        images, targets, name=name, split=split, classes=classes, mean=fmt.mean, std=fmt.std, source=str(folder)
    )
