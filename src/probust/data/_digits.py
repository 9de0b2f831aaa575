"""scikit-learn's 8x8 handwritten digits (bundled with scikit-learn, always offline).

scikit-learn ships one set of 1,797 images with values 0..16 and no split; probust draws a fixed
stratified split (20% test per class) from a seeded numpy generator, so the same images are in
the test split on every machine.
"""

from __future__ import annotations

import functools

import numpy as np
import torch

from probust._extras import import_extra
from probust.data._dataset import ImageDataset

TEST_FRACTION = 0.2
SPLIT_SEED = 0
_MEAN, _STD = (0.3055,), (0.3761,)  # training split, pixel units (values / 16)


def split_indices(labels: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The fixed (train, test) index split: per class, a seeded permutation, first 20% to test."""
    rng = np.random.default_rng(SPLIT_SEED)
    test = []
    for c in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == c))
        test.append(members[: int(round(TEST_FRACTION * members.size))])
    test_idx = np.sort(np.concatenate(test))
    train_idx = np.setdiff1d(np.arange(labels.size), test_idx)
    return train_idx, test_idx


@functools.lru_cache(maxsize=1)
def _digits() -> tuple[np.ndarray, np.ndarray]:
    # scikit-learn parses a CSV on every call; the arrays never change.
    datasets = import_extra("sklearn.datasets", extra="data", feature="the digits data set")
    bunch = datasets.load_digits()
    images, labels = bunch.images.astype(np.uint8), bunch.target.astype(np.int64)
    images.flags.writeable = labels.flags.writeable = False
    return images, labels


def load_digits_dataset(split: str) -> ImageDataset:
    """Loads the digits data set; see :func:`probust.data.load`."""
    all_images, labels = _digits()
    train_idx, test_idx = split_indices(labels)
    idx = train_idx if split == "train" else test_idx
    images = torch.from_numpy(all_images[idx]).unsqueeze(1).contiguous()
    return ImageDataset(
        images,
        torch.from_numpy(labels[idx]),
        name="digits",
        split=split,
        classes=[str(d) for d in range(10)],
        scale=16.0,
        mean=_MEAN,
        std=_STD,
        source="sklearn.datasets.load_digits",
    )
