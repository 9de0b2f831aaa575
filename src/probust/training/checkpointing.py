"""What a training run records in its checkpoint, and resuming from one.

After every epoch :func:`probust.training.train` writes (atomically, with a JSON sidecar) the
weights, the metadata of :func:`epoch_meta` and, unless the run is complete, the optimiser and
schedule state and the extra loss's ``state_dict()``. A run is resumed only when every key of
:data:`RESUME_KEYS` in the saved metadata equals the asked one; the layout is the one every
earlier version wrote, so their checkpoints still resume.
"""

from __future__ import annotations

import datetime as _dt
import json
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from probust import data as _data
from probust import models as _models
from probust._json import jsonable
from probust.errors import Setting
from probust.training.config import TrainConfig
from probust.training.objectives import ExtraLoss

#: What must match for a checkpoint to be resumed (anything else would change the result).
RESUME_KEYS = (
    "dataset",
    "arch",
    "num_classes",
    "input_shape",
    "epochs",
    "lr",
    "batch_size",
    "momentum",
    "weight_decay",
    "schedule",
    "grad_reg",
    "seed",
    "augment",
    "arch_kwargs",
    "train_size",
    "extra_loss",
)


def loss_name(extra_loss: ExtraLoss | None) -> str | None:
    """The name a run records for its extra loss (``meta["extra_loss"]``, one of
    :data:`RESUME_KEYS`): its ``__qualname__`` (a :class:`~probust.RobustLoss`'s names its
    settings), else its type's name; None without one."""
    return getattr(extra_loss, "__qualname__", type(extra_loss).__name__) if extra_loss else None


def run_settings(
    config: TrainConfig,
    dataset: str,
    arch: str,
    train_ds: _data.ImageDataset,
    model: nn.Module,
    extra_loss: ExtraLoss | None,
) -> dict[str, Any]:
    """The settings part of a run's metadata (what :data:`RESUME_KEYS` are checked against).

    Args:
        config: the run's settings with every field resolved (:meth:`TrainConfig.for_arch`, and
            ``augment`` a bool).
        dataset: the data set's name. arch: the architecture's name.
        train_ds: the training split. model: the model built for it (its spec is recorded).
        extra_loss: recorded by :func:`loss_name`, and by its ``config()`` (when it has one) as
            ``extra_loss_config``.

    Raises:
        ValueError: ``extra_loss.config()`` returns something JSON cannot write.
    """
    input_shape = list(train_ds.input_shape)
    settings: dict[str, Any] = {
        "dataset": dataset,
        "arch": arch,
        "num_classes": train_ds.num_classes,
        "input_shape": input_shape,
        "arch_kwargs": (_models.spec_of(model) or {}).get("arch_kwargs", {}),
        "classes": list(getattr(train_ds, "classes", [])),
        "epochs": config.epochs,
        "lr": config.lr,
        "batch_size": config.batch_size,
        "momentum": config.momentum,
        "weight_decay": config.weight_decay,
        "schedule": config.schedule,
        "grad_reg": config.grad_reg,
        "grad_reg_form": "mean_i ||d CE(f(x_i), y_i) / d x_i||^2, x in pixel units",
        "augment": config.augment,
        "seed": int(config.seed),
        "train_size": len(train_ds),
        "extra_loss": loss_name(extra_loss),
    }
    # The loss's settings, for readers of the metadata (e.g. the experiments); resumption keeps
    # matching on "extra_loss" alone, so checkpoints written before this key existed still resume.
    config_of = getattr(extra_loss, "config", None)
    if callable(config_of):
        settings["extra_loss_config"] = _jsonable(config_of())
    return settings


def new_progress() -> dict[str, Any]:
    """The progress part of a run's metadata before its first epoch."""
    return {
        "epochs_completed": 0,
        "history": [],
        "train_seconds": 0.0,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),  # noqa: UP017 (datetime.UTC needs Python 3.11; probust supports 3.10)
    }


def epoch_meta(
    settings: dict[str, Any], progress: dict[str, Any], done: bool, test_accuracy: float | None, device: torch.device
) -> dict[str, Any]:
    """The metadata saved after an epoch: settings, progress and where it ran."""
    return {
        **settings,
        **progress,
        "complete": done,
        "test_accuracy": test_accuracy,
        "device": str(device),
        "torch_version": torch.__version__,
        "probust_version": _models.probust_version(),
    }


def save(
    path: Path,
    model: nn.Module,
    meta: dict[str, Any],
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra_loss: ExtraLoss | None,
) -> None:
    """Writes the checkpoint of an epoch; the optimiser, schedule and extra loss state (when it
    has ``state_dict()``) only while ``meta["complete"]`` is false."""
    done = meta["complete"]
    state = None if done else {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
    state_of = getattr(extra_loss, "state_dict", None)
    if state is not None and callable(state_of):
        state["extra_loss"] = state_of()  # e.g. RobustLoss's warm-up count
    _models.save_checkpoint(path, model, meta, train_state=state)


def restore(
    path: Path,
    settings: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra_loss: ExtraLoss | None = None,
) -> dict[str, Any]:
    """Loads the run saved at ``path`` into model, optimiser, schedule and the extra loss's
    state (when it has ``load_state_dict`` and the checkpoint holds one); returns its meta.

    Raises:
        CheckpointError: ``path`` is not a probust checkpoint.
        CheckpointMismatchError: the saved run has other settings than ``settings``.
    """
    try:
        payload = _models.read_checkpoint(path, map_location="cpu")
    except _models.CheckpointError as exc:
        raise _models.CheckpointError(str(exc), "; pass ", Setting("resume", False), " to overwrite it") from None
    saved = payload["meta"]
    problems = [
        f"{key}={saved.get(key)!r} there, {settings.get(key)!r} asked"
        for key in RESUME_KEYS
        if saved.get(key) != settings.get(key)
    ]
    if problems:
        raise _models.CheckpointMismatchError(
            f"{path} holds a run with other settings ({'; '.join(problems)}); pass ",
            Setting("resume", False),
            " to start over, or write the checkpoint elsewhere",
        )
    model.load_state_dict(payload["state_dict"])
    if not saved.get("complete"):
        optimizer.load_state_dict(payload["train_state"]["optimizer"])
        scheduler.load_state_dict(payload["train_state"]["scheduler"])
        loss_state = payload["train_state"].get("extra_loss")
        load_state = getattr(extra_loss, "load_state_dict", None)
        if loss_state is not None and callable(load_state):
            load_state(loss_state)
    return saved


def _jsonable(value: Any) -> Any:
    """``value`` with tensors, numpy scalars and tuples turned into JSON types (checked)."""

    def leaf(v: Any) -> Any:
        if isinstance(v, Tensor):
            return v.tolist()
        if hasattr(v, "item") and callable(v.item):  # numpy scalars
            return v.item()
        return v

    out = jsonable(value, leaf)
    try:
        json.dumps(out)
    except TypeError as exc:
        raise ValueError(f"extra_loss.config() must return JSON-serialisable settings: {exc}") from None
    return out
