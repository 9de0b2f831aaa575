"""The in-memory image data set every loader in :mod:`probust.data` returns."""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import Tensor
from torch.utils.data import Dataset


class ImageDataset(Dataset):
    """Images held in memory as integers, served as float32 in [0, 1].

    Items are ``(x, label)`` with ``x`` a float32 tensor of shape ``[C, H, W]`` in pixel units
    ([0, 1]) and ``label`` an ``int``. No normalisation is applied here: a model that wants
    normalised inputs carries that as a layer, so that noise ``sigma`` is always in pixel units.

    Attributes:
        name: canonical data set name, e.g. ``"fashion-mnist"``.
        split: ``"train"`` or ``"test"``.
        classes: class names, index = label.
        mean, std: per-channel statistics of the training split in pixel units, for models
            that normalise their input.
        source: where the data were read from (a folder, or a package for built-in data).
    """

    def __init__(
        self,
        images: Tensor,
        targets: Tensor,
        *,
        name: str,
        split: str,
        classes: Sequence[str],
        scale: float = 255.0,
        mean: Sequence[float] | None = None,
        std: Sequence[float] | None = None,
        source: str = "",
    ) -> None:
        """Args:
        images: ``[N, C, H, W]`` raw values; ``images / scale`` must lie in [0, 1].
        targets: ``[N]`` integer labels in ``[0, len(classes))``.
        name, split, classes, mean, std, source: see the class attributes.
        scale: divisor that maps the raw values to [0, 1] (255 for 8-bit images).
        """
        if images.ndim != 4:
            raise ValueError(f"images must have shape [N, C, H, W], got {tuple(images.shape)}")
        if targets.shape != (images.shape[0],):
            raise ValueError(f"targets must have shape [{images.shape[0]}], got {tuple(targets.shape)}")
        self._images = images
        self._targets = targets.to(torch.int64)
        self._scale = float(scale)
        self.name = name
        self.split = split
        self.classes = list(classes)
        channels = images.shape[1]
        self.mean = tuple(mean) if mean is not None else (0.0,) * channels
        self.std = tuple(std) if std is not None else (1.0,) * channels
        self.source = source

    @property
    def input_shape(self) -> tuple[int, int, int]:
        """Shape of one input, ``(C, H, W)``."""
        return tuple(self._images.shape[1:])  # type: ignore[return-value]

    @property
    def num_classes(self) -> int:
        return len(self.classes)

    @property
    def targets(self) -> Tensor:
        """All labels, int64 ``[N]``."""
        return self._targets

    def __len__(self) -> int:
        return self._images.shape[0]

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        x = self._images[index].to(torch.float32) / self._scale
        return x, int(self._targets[index])

    def tensors(self) -> tuple[Tensor, Tensor]:
        """The whole data set at once.

        Returns:
            ``(X, y)``: X float32 ``[N, C, H, W]`` in [0, 1], y int64 ``[N]``.
        """
        return self._images.to(torch.float32) / self._scale, self._targets.clone()

    def subset(self, indices: Sequence[int] | Tensor) -> ImageDataset:
        """A data set with the same attributes holding only ``indices`` (in that order)."""
        idx = torch.as_tensor(indices, dtype=torch.int64)
        return ImageDataset(
            self._images[idx],
            self._targets[idx],
            name=self.name,
            split=self.split,
            classes=self.classes,
            scale=self._scale,
            mean=self.mean,
            std=self.std,
            source=self.source,
        )

    def __repr__(self) -> str:
        return (
            f"ImageDataset(name={self.name!r}, split={self.split!r}, n={len(self)}, "
            f"input_shape={self.input_shape}, num_classes={self.num_classes}, source={self.source!r})"
        )
