"""A folder of images in one subfolder per class (torchvision's ImageFolder layout), read lazily.

    root/cat/001.png, root/cat/002.jpg, root/dog/xyz.png -> classes ["cat", "dog"]

Only the headers are read when the folder is opened (every file is checked to be a readable
image, and the sizes to agree unless ``image_size`` fixes them); pixels are read when points
are asked for. Values are in [0, 1]: 8-bit images divided by 255.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import Dataset

from probust._extras import import_extra
from probust.data._errors import DataFormatError
from probust.errors import Placeholder, Setting

#: File name endings read as images (torchvision's ImageFolder's list); other files are ignored.
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")
_GREY_MODES = ("1", "L", "LA", "I", "I;16", "F")


class ImageFolderDataset(Dataset):
    """Images read from files on demand: ``ds[i] -> (x float32 [C, H, W] in [0, 1], label int)``.

    Attributes: as :class:`~probust.data.ImageDataset` (``name``, ``split`` "all", ``classes`` the
    subfolder names, ``source`` the folder), plus ``files``.
    """

    def __init__(
        self,
        files: Sequence[Path],
        labels: Sequence[int],
        *,
        classes: Sequence[str],
        size: tuple[int, int],
        channels: int,
        name: str,
        source: str,
        resize: bool,
    ) -> None:
        self.files = list(files)
        self._labels = torch.as_tensor(list(labels), dtype=torch.int64)
        self.classes = list(classes)
        self._size, self._channels, self._resize = size, channels, resize
        self.name, self.split, self.source = name, "all", source
        self.mean, self.std = (0.0,) * channels, (1.0,) * channels
        self.details = {"format": "image-folder", "image_size": list(size), "channels": channels}

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return (self._channels, *self._size)

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def targets(self) -> Tensor:
        return self._labels

    def __len__(self) -> int:
        return len(self.files)

    def _read(self, path: Path) -> Tensor:
        Image = import_extra("PIL.Image", extra="data", feature="a folder of images")

        try:
            with Image.open(path) as opened:
                image = opened.convert("L" if self._channels == 1 else "RGB")
                if self._resize and image.size != (self._size[1], self._size[0]):
                    image = image.resize((self._size[1], self._size[0]), Image.Resampling.BILINEAR)
                array = np.asarray(image, dtype=np.uint8)
        except OSError as exc:
            raise DataFormatError(f"{path}: cannot read the image ({exc})") from None
        if array.ndim == 2:
            array = array[:, :, None]
        if array.shape[:2] != self._size:
            raise DataFormatError(
                f"{path}: is {array.shape[1]}x{array.shape[0]}, the folder's images are "
                f"{self._size[1]}x{self._size[0]}; pass ",
                Setting("image_size", Placeholder("N")),
            )
        return torch.from_numpy(array.copy()).permute(2, 0, 1).to(torch.float32) / 255.0

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self._read(self.files[index]), int(self._labels[index])

    def tensors(self) -> tuple[Tensor, Tensor]:
        """Every image read: ``(X float32 [N, C, H, W] in [0, 1], y int64 [N])``."""
        if not self.files:
            return torch.empty((0, *self.input_shape)), self._labels.clone()
        return torch.stack([self._read(p) for p in self.files]), self._labels.clone()

    def subset(self, indices: Sequence[int] | Tensor) -> ImageFolderDataset:
        idx = torch.as_tensor(indices, dtype=torch.int64).tolist()
        return ImageFolderDataset(
            [self.files[i] for i in idx],
            self._labels[idx].tolist(),
            classes=self.classes,
            size=self._size,
            channels=self._channels,
            name=self.name,
            source=self.source,
            resize=self._resize,
        )

    def __repr__(self) -> str:
        return (
            f"ImageFolderDataset(name={self.name!r}, n={len(self)}, input_shape={self.input_shape}, "
            f"num_classes={self.num_classes}, source={self.source!r})"
        )


def read_image_folder(
    root: Path, image_size: int | Sequence[int] | None = None, channels: int | None = None
) -> ImageFolderDataset:
    """Open ``root`` (one subfolder per class, sorted by name) and check every image's header.

    Args:
        image_size: resize every image to this size: an int (square) or (height, width); None:
            all images must have the same size.
        channels: 1 (grey) or 3 (RGB); None: 3 if any image is in colour, else 1.
    """
    Image = import_extra("PIL.Image", extra="data", feature="a folder of images")
    UnidentifiedImageError = Image.UnidentifiedImageError

    size = _check_size(image_size)
    if channels is not None and channels not in (1, 3):
        raise DataFormatError(f"channels must be 1 (grey) or 3 (RGB), got {channels!r}")
    classes = sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith("."))
    if not classes:
        raise DataFormatError(
            f"{root}: an image folder needs one subfolder per class (root/<class>/<image>); none found"
        )
    files: list[Path] = []
    labels: list[int] = []
    sizes: dict[tuple[int, int], Path] = {}
    colour = False
    for label, name in enumerate(classes):
        members = sorted(p for p in (root / name).rglob("*") if p.is_file() and p.suffix.lower() in IMAGE_EXTENSIONS)
        if not members:
            raise DataFormatError(
                f"{root / name}: the class folder {name!r} holds no images ({', '.join(IMAGE_EXTENSIONS)})"
            )
        for path in members:
            try:
                with Image.open(path) as image:
                    image.verify()
                    width, height, mode = image.size[0], image.size[1], image.mode
            except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
                raise DataFormatError(f"{path}: not a readable image ({type(exc).__name__}: {exc})") from None
            sizes.setdefault((height, width), path)
            colour = colour or mode not in _GREY_MODES
            files.append(path)
            labels.append(label)
    if size is None:
        if len(sizes) > 1:
            (a, pa), (b, pb) = list(sizes.items())[:2]
            raise DataFormatError(
                f"{root}: images of mixed sizes ({pa} is {a[1]}x{a[0]}, {pb} is {b[1]}x{b[0]}); pass ",
                Setting("image_size", Placeholder("N")),
                " to resize them to one size",
            )
        size = next(iter(sizes))
    return ImageFolderDataset(
        files,
        labels,
        classes=classes,
        size=size,
        channels=channels if channels is not None else (3 if colour else 1),
        name=root.name,
        source=str(root.resolve()),
        resize=image_size is not None,
    )


def _check_size(image_size: int | Sequence[int] | None) -> tuple[int, int] | None:
    if image_size is None:
        return None
    values = [image_size] if isinstance(image_size, (int, np.integer)) else list(image_size)
    if len(values) == 1:
        values = values * 2
    if len(values) != 2 or any(isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1 for v in values):
        raise DataFormatError(f"image_size must be a positive int or (height, width), got {image_size!r}")
    return int(values[0]), int(values[1])
