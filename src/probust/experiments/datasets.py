"""The data set a run scored, loaded here and checked against the run, and images of its points."""

from __future__ import annotations

import numpy as np

from probust.experiments.run_info import Run

__all__ = ["images", "load_dataset", "torch_index"]


def load_dataset(run: Run):
    """The data set a run scored (``probust.data.load`` of its name and split), checked against
    the run: same size, and the labels of the scored points match.

    Raises:
        ExperimentSkipped: the data set cannot be loaded here or is not the one scored.
    """
    from probust import data as pdata
    from probust.experiments.base import ExperimentSkipped

    recorded = run.results_config.settings
    name, split = recorded.dataset, recorded.split
    try:
        if name is None or split is None:
            raise ValueError("its name and split are not recorded")
        ds = pdata.load(name, split)
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
