"""Training the paper's models with SGD, checkpointing every epoch; resumable.

Training is SGD with momentum and a per-step learning-rate schedule, on the objective of
:mod:`probust.training.objectives` (cross-entropy, optional gradient-norm penalty, optional extra
loss). After every epoch a checkpoint (:mod:`probust.training.checkpointing`) and its JSON
sidecar are written atomically; run again with ``resume=True`` and training continues from the
last completed epoch, giving the same final weights on CPU as an uninterrupted run (shuffling,
augmentation and any randomness in the model are seeded per epoch from ``seed``).

Settings are given either as keywords or as one :class:`~probust.training.TrainConfig`:

Example:
    >>> result = probust.training.train("fashion-mnist", "cnn", epochs=3, out="models/fmnist_cnn.pt")
    >>> config = probust.training.TrainConfig(epochs=3)
    >>> same = probust.training.train("fashion-mnist", "cnn", config=config, out="models/fmnist_cnn.pt")
    >>> result.meta["test_accuracy"]
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, cast

import torch
from torch import Tensor, nn

from probust import data as _data
from probust import models as _models
from probust.training import checkpointing
from probust.training.augment import crop_and_flip
from probust.training.config import SCHEDULES, TrainConfig
from probust.training.objectives import ExtraLoss, dataset_tensors, evaluate, objective


@dataclass
class TrainResult:
    """What :func:`train` returns.

    Attributes:
        model: the trained model (eval mode, on the training device).
        meta: the metadata saved with it (see :func:`train`).
        path: the checkpoint, or None when ``out`` was None.
    """

    model: nn.Module
    meta: dict[str, Any]
    path: Path | None


def train(
    dataset: str | _data.ImageDataset = "fashion-mnist",
    arch: str = "cnn",
    *,
    config: TrainConfig | None = None,
    out: str | os.PathLike | None = None,
    resume: bool = True,
    show_progress: bool = True,
    extra_loss: ExtraLoss | None = None,
    test_dataset: _data.ImageDataset | None = None,
    root: str | os.PathLike | None = None,
    download: bool = False,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
    tracker: Watcher | None = None,
    epochs: int | None = None,
    lr: float | None = None,
    batch_size: int | None = None,
    grad_reg: float = 0.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    momentum: float = 0.9,
    weight_decay: float | None = None,
    schedule: str = "cosine",
    augment: bool | None = None,
    arch_kwargs: dict[str, Any] | None = None,
    num_threads: int | None = None,
) -> TrainResult:
    """Trains a model with SGD, checkpointing every epoch; resumable.

    The training settings come either from ``config`` or from the keywords ``epochs`` to
    ``num_threads`` (the fields of :class:`TrainConfig`, documented there), not both:
    ``train(ds, "cnn", epochs=3, lr=0.05)`` and ``train(ds, "cnn", config=TrainConfig(epochs=3,
    lr=0.05))`` are the same run.

    Args:
        dataset: a name from :data:`probust.data.DATASETS` (both splits are loaded), or an
            :class:`~probust.data.ImageDataset` to train on (then ``test_dataset`` is evaluated).
        arch: a name from :data:`probust.models.ARCHS`.
        config: all training settings at once; the setting keywords must then keep their defaults.
        out: checkpoint path (``<out>.json`` gets the metadata); None keeps the model in memory only.
        resume: continue from ``out`` if it holds an unfinished run with the same settings, or
            return it as is if finished; False starts over and overwrites it.
        show_progress: a tqdm bar per epoch with running loss and accuracy.
        extra_loss: ``(model, x, y, logits) -> scalar`` added to every batch's loss. If it has
            ``state_dict()`` / ``load_state_dict()`` (as :class:`~probust.RobustLoss`'s warm-up
            count), that state is checkpointed and restored on resumption.
        test_dataset: test split when ``dataset`` is a data set object.
        root, download: passed to :func:`probust.data.load`.
        on_epoch_end: called as ``(epoch, meta)`` after each epoch's checkpoint is written.
        tracker: updated with the model after every epoch (a :class:`probust.issues.Tracker`,
            or anything with ``update(model)``); with ``out`` its state is saved beside the
            checkpoint (``<out>.tracker.npz``, where it has ``save`` / ``load``) and restored on
            resumption, so a resumed run's tracker has seen every epoch once.
        epochs, lr, batch_size, grad_reg, seed, device, momentum, weight_decay, schedule, augment,
            arch_kwargs, num_threads: the fields of :class:`TrainConfig` (None takes
            :data:`~probust.training.DEFAULTS` for ``arch`` where the field allows it).

    Returns:
        :class:`TrainResult` with the model, its meta and the checkpoint path. ``meta`` holds
        dataset, arch, num_classes, input_shape, classes, grad_reg, epochs, epochs_completed, lr,
        batch_size, momentum, weight_decay, schedule, augment, seed, test_accuracy, history (per
        epoch: train loss/accuracy, test accuracy, lr, seconds), train_seconds, device,
        torch_version, probust_version, created, complete; ``extra_loss`` (the loss's
        ``__qualname__``, e.g. a :class:`~probust.RobustLoss`'s repr naming its settings, or None)
        and, when the loss has a ``config()`` method, ``extra_loss_config`` (its result).

    Raises:
        TypeError: ``config`` together with a setting keyword changed from its default.
        ValueError: unknown names or bad hyper-parameters (before any work).
        probust.data.ProbustDataError: the data set is missing.
        probust.models.CheckpointMismatchError: ``out`` holds a run with other settings and
            ``resume`` is True.
    """
    keywords: dict[str, Any] = dict(
        epochs=epochs,
        lr=lr,
        batch_size=batch_size,
        weight_decay=weight_decay,
        momentum=momentum,
        schedule=schedule,
        grad_reg=grad_reg,
        seed=seed,
        augment=augment,
        arch_kwargs=arch_kwargs,
        num_threads=num_threads,
        device=device,
    )
    if config is None:
        config = TrainConfig(**keywords)
    else:
        if not isinstance(config, TrainConfig):
            raise TypeError(f"config must be a probust.training.TrainConfig, got {type(config).__name__}")
        defaults = {f.name: f.default for f in dataclasses.fields(TrainConfig)}
        given = [name for name, value in keywords.items() if not (value is defaults[name] or value == defaults[name])]
        if given:
            raise TypeError(
                f"train() got config and {', '.join(given)}: give the settings in config or as keywords, not both"
            )
    with _cpu_threads(config.num_threads):
        return _train(
            dataset,
            arch,
            config,
            out=out,
            resume=resume,
            show_progress=show_progress,
            extra_loss=extra_loss,
            test_dataset=test_dataset,
            root=root,
            download=download,
            on_epoch_end=on_epoch_end,
            tracker=tracker,
        )


class Watcher(Protocol):
    """What :func:`train` updates after every epoch (:class:`probust.issues.Tracker`)."""

    def update(self, model: nn.Module) -> None: ...


def tracker_path(out: Path) -> Path:
    """Where :func:`train` keeps its tracker's state beside the checkpoint ``out``."""
    return out.with_name(out.name + ".tracker.npz")


def _restore_tracker(tracker: Watcher | None, path: Path, model: nn.Module, epochs_completed: int) -> None:
    """The tracker's state as of the checkpoint's last epoch. The tracker is saved after the
    checkpoint, so a run stopped between the two has the checkpoint's epoch still to record: it is
    recorded from the restored model, which is that epoch's."""
    if tracker is None or epochs_completed == 0 or not hasattr(tracker, "load"):
        return
    saved = tracker_path(path)
    if saved.exists():
        tracker.load(saved)
    seen = int(getattr(tracker, "updates", epochs_completed))
    if seen == epochs_completed - 1:
        tracker.update(model)
        tracker.save(saved)  # type: ignore[attr-defined]
    elif seen != epochs_completed:
        raise ValueError(
            f"{path} holds {epochs_completed} trained epoch(s) but its tracker state ({saved.name}) has {seen} "
            "update(s): train again with resume=False, or without tracker"
        )


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else as given (checked)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use 'cpu' or 'auto'")
    return dev


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Optimiser steps in one epoch over n examples at ``batch_size`` (what warm-ups count)."""
    full, rest = divmod(n, batch_size)
    return full + (rest > 1)  # a last batch of one is dropped: BatchNorm cannot train on it


@contextlib.contextmanager
def _cpu_threads(num_threads: int | None) -> Iterator[None]:
    if num_threads is None:
        yield
        return
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _derive_seed(seed: int, epoch: int) -> int:
    # Distinct, reproducible streams per (seed, epoch): what makes resumption exact.
    return (int(seed) * 1_000_003 + epoch * 7_919 + 12_345) % (2**63 - 1)


def _train(
    dataset: str | _data.ImageDataset,
    arch: str,
    config: TrainConfig,
    *,
    out: str | os.PathLike | None,
    resume: bool,
    show_progress: bool,
    extra_loss: ExtraLoss | None,
    test_dataset: _data.ImageDataset | None,
    root: str | os.PathLike | None,
    download: bool,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None,
    tracker: Watcher | None = None,
) -> TrainResult:
    config = config.for_arch(arch)
    epochs, batch_size = cast(int, config.epochs), cast(int, config.batch_size)
    dev = resolve_device(config.device)

    name, train_ds, test_ds = _datasets(dataset, test_dataset, root, download)
    if config.augment is None:
        config = dataclasses.replace(config, augment=name in ("cifar10", "cifar100"))
    input_shape = list(train_ds.input_shape)
    kwargs = dict(config.arch_kwargs or {})
    kwargs.setdefault("mean", list(getattr(train_ds, "mean", [0.0] * input_shape[0])))
    kwargs.setdefault("std", list(getattr(train_ds, "std", [1.0] * input_shape[0])))

    torch.manual_seed(config.seed)
    try:
        model = _models.build(arch, train_ds.num_classes, input_shape, **kwargs)
    except TypeError as exc:  # an option the architecture does not take
        raise ValueError(f"architecture {arch!r} does not accept the options {sorted(kwargs)}: {exc}") from None
    settings = checkpointing.run_settings(config, name, arch, train_ds, model, extra_loss)
    if steps_per_epoch(len(train_ds), batch_size) == 0:
        raise ValueError(f"the training set needs at least 2 examples, it has {len(train_ds)}")
    model.to(dev)
    total_steps = epochs * steps_per_epoch(len(train_ds), batch_size)
    optimizer = torch.optim.SGD(
        model.parameters(),
        lr=cast(float, config.lr),
        momentum=config.momentum,
        weight_decay=cast(float, config.weight_decay),
    )
    factor = SCHEDULES[config.schedule]
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda step: factor(min(step, total_steps - 1) / total_steps)
    )

    path = Path(out) if out is not None else None
    progress = checkpointing.new_progress()
    if path is not None and resume and path.exists():
        saved = checkpointing.restore(path, settings, model, optimizer, scheduler, extra_loss)
        _restore_tracker(tracker, path, model, int(saved["epochs_completed"]))
        if saved.get("complete"):
            model.eval()
            return TrainResult(model=model, meta=saved, path=path)
        progress = {k: saved[k] for k in progress}

    X, Y = dataset_tensors(train_ds, train_ds.num_classes)
    meta: dict[str, Any] = {}
    for epoch in range(progress["epochs_completed"], epochs):
        t0 = time.perf_counter()
        stats = _run_epoch(model, X, Y, optimizer, scheduler, epoch, config, extra_loss, dev, show_progress)
        test_acc = evaluate(model, test_ds, dev) if test_ds is not None else None
        seconds = time.perf_counter() - t0
        progress["epochs_completed"] = epoch + 1
        progress["history"] = progress["history"] + [
            {"epoch": epoch + 1, **stats, "test_accuracy": test_acc, "seconds": round(seconds, 3)}
        ]
        progress["train_seconds"] = round(progress["train_seconds"] + seconds, 3)
        if show_progress:
            _report(epoch, epochs, stats, test_acc, seconds)
        done = epoch + 1 == epochs
        meta = checkpointing.epoch_meta(settings, progress, done, test_acc, dev)
        if path is not None:
            checkpointing.save(path, model, meta, optimizer, scheduler, extra_loss)
        if tracker is not None:
            tracker.update(model)
            if path is not None and hasattr(tracker, "save"):
                tracker.save(tracker_path(path))
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, meta)
    model.eval()
    return TrainResult(model=model, meta=meta, path=path)


def _datasets(
    dataset: str | _data.ImageDataset,
    test_dataset: _data.ImageDataset | None,
    root: str | os.PathLike | None,
    download: bool,
) -> tuple[str, _data.ImageDataset, _data.ImageDataset | None]:
    """(name, train split, test split) from a data set name or objects."""
    if isinstance(dataset, str):
        name = _data.canonical_name(dataset)
        return (
            name,
            _data.load(name, "train", root=root, download=download),
            _data.load(name, "test", root=root, download=download),
        )
    return getattr(dataset, "name", "custom"), dataset, test_dataset


def _run_epoch(
    model: nn.Module,
    X: Tensor,
    Y: Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    epoch: int,
    config: TrainConfig,
    extra_loss: ExtraLoss | None,
    device: torch.device,
    show_progress: bool,
) -> dict[str, float]:
    """One epoch of SGD steps over ``X, Y`` with the resolved ``config``; running statistics."""
    epochs, seed, batch_size = cast(int, config.epochs), config.seed, cast(int, config.batch_size)
    gen = torch.Generator().manual_seed(_derive_seed(seed, epoch))
    torch.manual_seed(_derive_seed(seed, epoch) + 1)  # dropout and the like inside the model
    order = torch.randperm(len(Y), generator=gen)
    n_batches = steps_per_epoch(len(Y), batch_size)
    model.train()
    total_loss, correct, seen = 0.0, 0, 0
    bar = None
    if show_progress:
        from tqdm.auto import tqdm

        bar = tqdm(total=n_batches, desc=f"epoch {epoch + 1}/{epochs}", unit="batch", dynamic_ncols=True, leave=False)
    try:
        for b in range(n_batches):
            idx = order[b * batch_size : (b + 1) * batch_size]
            xb, yb = X[idx], Y[idx]
            if config.augment:
                xb = crop_and_flip(xb, gen)
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss, logits = objective(model, xb, yb, config.grad_reg, extra_loss)
            if not torch.isfinite(loss):
                raise FloatingPointError(
                    f"loss became {loss.item()} at epoch {epoch + 1}, batch {b + 1}; lower lr or grad_reg"
                )
            loss.backward()
            optimizer.step()
            scheduler.step()
            n = len(yb)
            total_loss += float(loss.detach()) * n
            correct += int((logits.detach().argmax(1) == yb).sum())
            seen += n
            if bar is not None:
                bar.update(1)
                if b % 10 == 0 or b == n_batches - 1:
                    bar.set_postfix(loss=f"{total_loss / seen:.4f}", acc=f"{correct / seen:.4f}", refresh=False)
    finally:
        if bar is not None:
            bar.close()
    return {
        "train_loss": total_loss / max(seen, 1),
        "train_accuracy": correct / max(seen, 1),
        "lr": optimizer.param_groups[0]["lr"],
    }


def _report(epoch: int, epochs: int, stats: dict[str, float], test_acc: float | None, seconds: float) -> None:
    from tqdm.auto import tqdm

    test = f", test accuracy {test_acc:.4f}" if test_acc is not None else ""
    tqdm.write(
        f"epoch {epoch + 1}/{epochs}: loss {stats['train_loss']:.4f}, train accuracy "
        f"{stats['train_accuracy']:.4f}{test}, {seconds:.1f} s"
    )
