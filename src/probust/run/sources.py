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
from torch.utils.data import Subset

from probust._inputs import NO_LABEL, TensorPoints, as_dataset, batch, loader_dataset, pixel_note
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
        return as_dataset(data)
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


def data_units_note(ds: Any, normalizing: bool = False, points: int = 8) -> str | None:
    """:func:`probust._inputs.pixel_note` of a data set's first ``points`` points (``ds[i] -> (x, label)``;
    ``normalizing``: the run normalises the inputs again, ``mean`` / ``std`` given)."""
    x, _ = batch(ds, np.arange(min(points, len(ds)), dtype=np.int64))
    return pixel_note(x, normalizing)
