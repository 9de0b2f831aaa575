"""Where a run's points come from: the device, the data set, and its hash (the model:
:mod:`probust.run.model_source`).

Everything here runs before any work: a data set or model that cannot be used raises
:class:`~probust.run.ConfigError` with a one-line message naming the argument.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    Dataset,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    Subset,
    TensorDataset,
    default_collate,
    default_convert,
)

from probust._json import jsonable
from probust.errors import Setting, first_parts
from probust.run.distributed import World
from probust.run.errors import ConfigError, first_line

#: The options of :class:`probust.data.FileOptions`: run settings of the same names.

__all__ = [
    "NO_LABEL",
    "TensorPoints",
    "as_dataset",
    "batch",
    "class_names",
    "config_value",
    "data_name",
    "data_split",
    "data_units_note",
    "device_type",
    "hash_data",
    "input_shape",
    "load_data",
    "loader_dataset",
    "num_classes",
    "point_paths",
    "resolve_device",
    "single_class_note",
]


def device_type(device: str | torch.device) -> str:
    """The device type the run will use ("auto" resolved), checked to exist on this machine."""
    if str(device) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"unknown device {device!r}; expected cpu, cuda, cuda:N or auto", field="device") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "cuda was asked for but no CUDA GPU is available here (use ",
            Setting("device", "cpu"),
            " or ",
            Setting("device", "auto"),
            ")",
            field="device",
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("mps was asked for but is not available here", field="device")
    return dev.type


def resolve_device(device: str | torch.device, device_type: str, world: World) -> torch.device:
    """The device this process runs on (under torchrun on GPUs: cuda:LOCAL_RANK), made current."""
    if device_type != "cuda":
        return torch.device(device_type)
    dev = torch.device("cuda") if str(device) == "auto" else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", world.local_rank if world.distributed else torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ConfigError(f"{dev} does not exist here ({torch.cuda.device_count()} GPUs)", field="device")
    torch.cuda.set_device(dev)  # so that code allocating on "cuda" without an index uses this rank's GPU
    return dev


def load_data(data: Any, split: str, root: str | os.PathLike | None, download: bool, options: Any = None) -> Any:
    """The data set: ``data`` itself when it is one, ``probust.data.load`` of a built-in name, else
    ``probust.data.load_file`` of a file or folder with ``options`` (:class:`probust.data.FileOptions`)."""
    from probust import data as pdata

    if isinstance(data, (str, os.PathLike)) and not pdata.is_builtin(data):
        try:
            return pdata.load_file(data, options)
        except pdata.ProbustDataError as exc:
            parts = first_parts(exc)  # the settings it names kept as such (flags on the command line)
            if not Path(data).exists():
                parts = (*parts, f", and not a built-in data set (known data sets: {', '.join(pdata.DATASETS)})")
            raise ConfigError(*parts, field="data") from None
        except ValueError as exc:  # an option that does not apply, or a bad option value
            raise ConfigError(
                first_line(exc) if getattr(exc, "field", None) is None else exc.reason,  # type: ignore[attr-defined]
                field=getattr(exc, "field", None) or "data_options",
            ) from None
    if options:
        given = pdata.FileOptions.of(options).given()
        if given:
            raise ConfigError("applies to data files and folders, not to built-in data sets", field=next(iter(given)))
    if not isinstance(data, (str, os.PathLike)):
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise ConfigError(
                f"must be a data set name or a Dataset with ds[i] -> (x, label), got {type(data).__name__}",
                field="data",
            )
        if len(data) == 0:
            raise ConfigError("the data set is empty", field="data")
        try:
            batch(data, np.arange(1, dtype=np.int64))
        except Exception as exc:
            raise ConfigError(
                f"cannot read ds[0] as (x, label) ({type(exc).__name__}: {first_line(exc)})", field="data"
            ) from None
        return data
    try:
        return pdata.load(str(data), split, root=root, download=download)
    except pdata.ProbustDataError as exc:
        # Its first line, and how to get the data (with the settings it names, kept as such).
        # probust.data's ``root`` is the run's ``data_root``.
        lines = exc.lines()
        hint = next((line for line in lines if line and str(line[0]).startswith("to get it")), ())
        error = ConfigError(*lines[0], *((" (", *hint, ")") if hint else ()), field="data")
        raise error.renamed({"root": "data_root"}) from None
    except FileNotFoundError as exc:
        raise ConfigError(first_line(exc), field="data") from None
    except ValueError as exc:
        raise ConfigError(*first_parts(exc), field="data") from None


class TensorPoints(Dataset):
    """Tensors as a data set: ``ds[i] -> (x float32 [*S], label int)``, for data given as
    tensors (``x`` [N, *S], or ``(x, y)``) rather than a data set.

    Attributes:
        name: "tensors"; ``split`` "all".
        labelled: whether labels were given; without them every label is -1 (:data:`NO_LABEL`).
        stored_dtype: the dtype ``x`` was given in when it is not floating point (served as
            float32 in its units, and refused by the runner, as a file's integer inputs are).
        source: "the tensor x", for messages.
    """

    def __init__(self, x: Any, y: Any = None) -> None:
        x = torch.as_tensor(x)
        if x.ndim < 2 or x.shape[0] == 0:
            raise ConfigError(
                f"expected inputs x [N, ...] with N >= 1, got a tensor of shape {list(x.shape)}", field="data"
            )
        self.labelled = y is not None
        if y is None:
            y = torch.full((x.shape[0],), NO_LABEL, dtype=torch.int64)
        else:
            y = torch.as_tensor(y)
            if y.shape != (x.shape[0],) or y.is_floating_point() or y.is_complex():
                raise ConfigError(
                    f"expected integer labels y [{x.shape[0]}] with x [{', '.join(map(str, x.shape))}], got "
                    f"{str(y.dtype).removeprefix('torch.')} {list(y.shape)}",
                    field="data",
                )
        self.stored_dtype = None if x.is_floating_point() else str(x.dtype).removeprefix("torch.")
        self._x, self._y = x.to(torch.float32), y.to(torch.int64)
        self.name, self.split, self.source = "tensors", "all", "the tensor x"

    @property
    def input_shape(self) -> tuple[int, ...]:
        return tuple(int(s) for s in self._x.shape[1:])

    @property
    def targets(self) -> Tensor:
        return self._y

    def __len__(self) -> int:
        return int(self._x.shape[0])

    def __getitem__(self, index: int) -> tuple[Tensor, int]:
        return self._x[index], int(self._y[index])

    def tensors(self) -> tuple[Tensor, Tensor]:
        """``(x float32 [N, *S], y int64 [N])``."""
        return self._x, self._y

    def subset(self, indices: Tensor) -> TensorPoints:
        part = TensorPoints(self._x[indices], self._y[indices])
        part.labelled, part.stored_dtype = self.labelled, self.stored_dtype
        return part


#: The label of a point whose data came without labels (:class:`TensorPoints`).
NO_LABEL = -1


def as_dataset(data: Any) -> Any:
    """The map-style data set ``data`` stands for: a DataLoader's (:func:`loader_dataset`);
    :class:`TensorPoints` for a tensor or array ``x`` [N, ...], a pair ``(x, y)`` or a
    one-tensor ``torch.utils.data.TensorDataset``; anything else as it is (a data set, a name,
    a path).

    Raises:
        ConfigError: (field ``data``) a DataLoader whose points cannot be read one by one as it
            reads them, or tensors of the wrong shapes.
    """
    if isinstance(data, DataLoader):
        return as_dataset(loader_dataset(data))
    if isinstance(data, (Tensor, np.ndarray)):
        return TensorPoints(data)
    pair = isinstance(data, (tuple, list)) and 1 <= len(data) <= 2
    if pair and all(isinstance(d, (Tensor, np.ndarray)) for d in data):
        return TensorPoints(*data)
    if isinstance(data, TensorDataset) and len(data.tensors) == 1:
        return TensorPoints(data.tensors[0])
    return data


def loader_dataset(loader: DataLoader) -> Any:
    """The data set a DataLoader reads, when reading it point by point (``ds[i]`` for every
    i, in order) gives the points the loader gives.

    Each point's random stream derives from its index in the data set, and the work is cut into
    blocks of its own size, so the loader's batch size and ``drop_last`` do not matter (every
    point is scored) and nor does ``num_workers`` (points are read in this process). Refused,
    with the reason: an ``IterableDataset`` (its points have no index), a shuffled loader or
    any sampler but the sequential one (the points it picks would not be those scored), and a
    ``collate_fn`` other than torch's default (what it does to a batch would be bypassed).

    Raises:
        ConfigError: (field ``data``) naming what to change.
    """
    ds = loader.dataset
    if isinstance(ds, IterableDataset):
        raise ConfigError(
            f"the DataLoader reads an IterableDataset ({type(ds).__name__}): its points have no index, from "
            "which each point's random stream is derived; give a map-style Dataset (ds[i] -> (x, label)) or "
            "the tensors (x, y)",
            field="data",
        )
    sampler = loader.sampler
    if isinstance(sampler, RandomSampler):
        raise ConfigError(
            "the DataLoader is shuffled (shuffle=True): its data set is read by index, in order (each "
            "point's random stream derives from its index), so the rows would not follow the loader's order; "
            "pass a loader with shuffle=False, or the data set itself (every row carries its point's index)",
            field="data",
        )
    batches = loader.batch_sampler
    if not isinstance(sampler, SequentialSampler) or (
        batches is not None and (type(batches) is not BatchSampler or batches.sampler is not sampler)
    ):
        picker = type(sampler if not isinstance(sampler, SequentialSampler) else batches).__name__
        raise ConfigError(
            f"the DataLoader picks its points with a {picker}: every point of loader.dataset is scored, in "
            "index order, so its choice would be ignored; choose the points with indices (or a "
            "torch.utils.data.Subset) and a loader without a sampler",
            field="data",
        )
    if loader.collate_fn not in (default_collate, default_convert):
        name = getattr(loader.collate_fn, "__name__", type(loader.collate_fn).__name__)
        raise ConfigError(
            f"the DataLoader has its own collate_fn ({name}): points are read from loader.dataset one by "
            "one (ds[i] -> (x, label)), which would bypass it; do what it does in the data set's transform "
            "(or in the model), or give the tensors (x, y)",
            field="data",
        )
    return ds


def class_names(ds: Any) -> list[str] | None:
    """The data set's class names, index = label (its ``classes``; a ``Subset``'s data set's),
    or None when it has none."""
    while isinstance(ds, Subset):
        ds = ds.dataset
    classes = getattr(ds, "classes", None)
    if isinstance(classes, (list, tuple)) and classes:
        return [str(c) for c in classes]
    return None


def point_paths(ds: Any, indices: np.ndarray) -> list[str] | None:
    """The file each point ``indices`` (int64 [P]) was read from, or None when the data set does
    not say: probust's image folders (``files``), torchvision's ``ImageFolder`` and
    ``DatasetFolder`` (``samples``: (path, class) pairs), and a ``Subset`` of either."""
    positions = np.asarray(indices, dtype=np.int64)
    while isinstance(ds, Subset):
        positions = np.asarray(ds.indices, dtype=np.int64)[positions]
        ds = ds.dataset
    files = getattr(ds, "files", None)
    if files is None and isinstance(getattr(ds, "samples", None), list):
        files = [sample[0] if isinstance(sample, (tuple, list)) else None for sample in ds.samples]
    # Only a list of one file per point of this very data set.
    if not isinstance(files, list) or len(files) != len(ds) or any(f is None for f in files):
        return None
    return [str(files[int(i)]) for i in positions]


def single_class_note(ds: Any, selected: np.ndarray, limit: int | None) -> str | None:
    """A warning when ``limit`` cut the data set to its first points and these hold one label
    while the data set holds several (a data set sorted by class, as an image folder is),
    saying how to spread them; None otherwise. Reads every label where the data set has
    ``targets``, else the selected points' items and its number of classes."""
    if limit is None or limit >= len(ds) or len(selected) < 2:
        return None
    targets = getattr(ds, "targets", None)
    if targets is not None and len(targets) == len(ds):
        labels = np.asarray(torch.as_tensor(targets), dtype=np.int64)
        chosen, several = labels[selected], len(np.unique(labels)) > 1
    else:
        chosen, several = batch(ds, selected)[1].numpy(), (num_classes(ds) or 0) > 1
    if not several or len(np.unique(chosen)) > 1 or int(chosen[0]) == NO_LABEL:
        return None
    label = int(chosen[0])
    names = class_names(ds)
    which = f"class {names[label]!r} (label {label})" if names and 0 <= label < len(names) else f"label {label}"
    step = len(ds) // limit
    return (
        f"limit={limit} scores the first {len(selected)} points of {data_name(ds)}, all of {which}, while it holds "
        f"several classes (is it sorted by class?); to spread them over the data set select them by index, "
        f'e.g. one point in every {step}, with the same limit: indices="0-{len(ds) - 1}:{step}" '
        f"(--indices 0-{len(ds) - 1}:{step})"
    )


def data_name(ds: Any) -> str:
    """The data set's name (its class name when it has none)."""
    return str(getattr(ds, "name", None) or type(ds).__name__)


def data_split(ds: Any, split: str) -> str:
    """The data set's split (``split`` when it does not say)."""
    return str(getattr(ds, "split", None) or split)


def batch(ds: Any, indices: np.ndarray) -> tuple[Tensor, Tensor]:
    """Points ``indices`` of ``ds``: (x float32 [B, *S], labels int64 [B])."""
    if hasattr(ds, "subset") and hasattr(ds, "tensors"):
        return ds.subset(torch.from_numpy(indices)).tensors()
    # A generic torch Dataset can only be read item by item.
    items = [ds[int(i)] for i in indices]
    x = torch.stack([torch.as_tensor(item[0]) for item in items]).to(torch.float32)
    y = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
    return x, y


def input_shape(ds: Any) -> tuple[int, ...]:
    """The shape of one point, [C, H, W]."""
    shape = getattr(ds, "input_shape", None)
    if shape is None:
        shape = tuple(torch.as_tensor(ds[0][0]).shape)
    return tuple(int(s) for s in shape)


def num_classes(ds: Any) -> int | None:
    """The number of classes, or None when the data set does not say."""
    n = getattr(ds, "num_classes", None)
    if n is None and getattr(ds, "classes", None) is not None:
        n = len(ds.classes)
    return None if n is None else int(n)


def hash_data(ds: Any, chunk: int = 4096) -> str:
    """sha256 over every point's float32 values and label (so a changed file is noticed)."""
    from probust.data import ProbustDataError

    h = hashlib.sha256()
    for first in range(0, len(ds), chunk):
        try:
            x, y = batch(ds, np.arange(first, min(first + chunk, len(ds)), dtype=np.int64))
        except ProbustDataError as exc:  # an image of a folder that fails to decode
            raise ConfigError(*first_parts(exc), field="data") from None
        h.update(x.contiguous().numpy().tobytes())
        h.update(y.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def config_value(value: Any) -> Any:
    """JSON types for config.json; an object JSON cannot hold is written as its str()."""
    return jsonable(value, lambda v: v if isinstance(v, (str, int, float, bool)) or v is None else str(v))


#: The inputs a data set's first points may span and still read as [0, 1] pixels.
PIXEL_RANGE = (-0.5, 1.5)


def data_units_note(ds: Any, normalizing: bool = False, points: int = 8) -> str | None:
    """A warning when a data set's images are visibly not [0, 1] pixels, else None.

    The noise is added to the tensors the model receives, so sigma is in their units. A data
    set whose transform normalises (``transforms.Normalize``) gives values around 0 with unit
    spread, and sigma is then in normalised units (std pixel units each) without a word. Only
    image-shaped points ([C, H, W]) are looked at: tables and flat inputs have units of their own.
    The rule, on the first ``points`` points: any value below -0.5 or above 1.5 (:data:`PIXEL_RANGE`;
    ImageNet's normalisation maps [0, 1] to about [-2.1, 2.6], a mean of 0.5 and std of 0.5 to [-1, 1]).

    Args:
        ds: the data set (``ds[i] -> (x, label)``).
        normalizing: whether the run normalises the inputs again (``mean`` / ``std`` given).
        points: how many of the first points are read.
    """
    x, _ = batch(ds, np.arange(min(points, len(ds)), dtype=np.int64))
    if x.ndim != 4 or not x.numel():
        return None
    lo, hi = float(x.min()), float(x.max())
    if PIXEL_RANGE[0] <= lo and hi <= PIXEL_RANGE[1]:
        return None
    seen = f"the inputs range from {lo:.3g} to {hi:.3g} over the first {x.shape[0]} points, not [0, 1]"
    if lo >= 0:  # e.g. 0..255 as floats
        return (
            f"{seen}: sigma is measured in those units (e.g. steps of 0..255); to have it in [0, 1] pixel units, "
            "scale the images to [0, 1] (e.g. transforms.ToTensor)"
        )
    again = " and mean/std normalise them once more, so the model sees them normalised twice" if normalizing else ""
    return (
        f"{seen}: they look normalised (e.g. by a transforms.Normalize in the Dataset's transform){again}, so "
        "sigma is measured in those normalised units (one unit there is std in pixel units, e.g. 0.229 for "
        "ImageNet's red channel); to keep sigma in [0, 1] pixel units, drop the normalisation from the data and "
        "give it to the model: --mean/--std on the command line, mean= and std= in Python, or "
        "probust.with_normalization(model, mean=..., std=...)"
    )
