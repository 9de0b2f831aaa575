"""The data set a run scored (built-in, or the user's own file or folder), loaded here and checked
against the run, and images of its points."""

from __future__ import annotations

import numpy as np

from probust.experiments.run_info import Run

__all__ = ["images", "load_dataset", "open_dataset", "torch_index"]


def _file_options(details: dict) -> dict:
    """The :class:`probust.data.FileOptions` a user's file was read with, from config.json's
    "data" -> "details"."""
    kind = details.get("format")
    if kind == "table":
        return {"label_column": details.get("label_column"), "feature_columns": details.get("features")}
    if kind == "image-folder":
        return {"image_size": details.get("image_size"), "channels": details.get("channels")}
    return {"x_key": details.get("x_key"), "y_key": details.get("y_key")}


def open_dataset(run: Run):
    """The data set a run scored: ``probust.data.load`` of a built-in name and split, or
    ``probust.data.load_file`` of the user's file or folder it was read from, as it was read."""
    from probust import data as pdata

    config = run.results_config
    details = config.raw.get("data", {}).get("details")
    if isinstance(details, dict) and config.data.source:
        return pdata.load_file(config.data.source, _file_options(details))
    name, split = config.settings.dataset, config.settings.split
    if name is None or split is None:
        raise ValueError("its name and split are not recorded")
    return pdata.load(name, split)


def load_dataset(run: Run, images_only: bool = False):
    """The data set a run scored (:func:`open_dataset`), checked against the run: same size, and
    the labels of the scored points match.

    Args:
        images_only: refuse data whose points are not images [C, H, W] (a table, say).

    Raises:
        ExperimentSkipped: the data set cannot be loaded here, is not the one scored, or (with
            ``images_only``) is not images.
    """
    from probust.experiments.base import ExperimentSkipped

    recorded = run.results_config.settings
    name, split = recorded.dataset, recorded.split
    shape = run.results_config.data.input_shape
    if images_only and shape is not None and len(shape) != 3:
        raise ExperimentSkipped(
            f"an image-only experiment, and the points of {name!r} scored by {run.label} are not images "
            f"(input shape {list(shape)}, not [channels, height, width])"
        )
    try:
        ds = open_dataset(run)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise ExperimentSkipped(
            f"the data set {name!r} ({split}) of {run.label} cannot be loaded here: {first}"
        ) from None
    if recorded.data_size is not None and len(ds) != recorded.data_size:
        raise ExperimentSkipped(
            f"the data set {name!r} here has {len(ds)} points, the results were made on {recorded.data_size}"
        )
    labels = run.table.drop_duplicates("index")
    targets = ds.targets if hasattr(ds, "targets") else None
    if targets is not None:
        idx = torch_index(labels["index"].to_numpy())
        if not np.array_equal(targets[idx].numpy(), labels["label"].to_numpy()):
            raise ExperimentSkipped(f"the labels of {name!r} here differ from those in the results of {run.label}")
    return ds


def torch_index(values):
    import torch

    return torch.from_numpy(np.array(values, dtype=np.int64))


def images(ds, indices) -> np.ndarray:
    """float32 [B, C, H, W] images in [0, 1] of the given points."""
    import torch

    idx = torch_index(indices)
    if hasattr(ds, "subset") and hasattr(ds, "tensors"):
        return ds.subset(idx).tensors()[0].numpy()
    return torch.stack([ds[int(i)][0] for i in idx]).numpy()
