"""Training the paper's models, with optional gradient-norm regularisation.

The objective for a batch of ``B`` examples is::

    mean_i CE(f(x_i), y_i)  +  lambda * mean_i || d CE(f(x_i), y_i) / d x_i ||_2^2  [+ extra_loss]

The paper writes the regulariser as ``lambda * ||grad_x f(x)||^2``; for a vector-valued ``f``
we use the gradient of the per-example cross-entropy loss, the standard double-backpropagation
form (Drucker & LeCun 1992; Srinivas & Fleuret 2018), computed with ``create_graph=True`` so that
its own gradient reaches the weights. Gradients are taken with respect to the inputs in pixel
units ([0, 1], before the model's normalisation layer), the units noise ``sigma`` is measured in.
The paper's robust family uses ``lambda`` in {0, 1e-4, 1e-3, 1e-2}.

Training is SGD with momentum and a per-step learning-rate schedule. After every epoch a
checkpoint (weights, metadata, optimiser and schedule state, and the extra loss's state when it
has a ``state_dict()``) and its JSON sidecar are written atomically; run again with
``resume=True`` and training continues from the last completed epoch, giving the same final
weights on CPU as an uninterrupted run (shuffling, augmentation and any randomness in the model
are seeded per epoch from ``seed``).

Example:
    >>> result = probust.train.train("fashion-mnist", "cnn", epochs=3, out="models/fmnist_cnn.pt")
    >>> result.meta["test_accuracy"]
"""

from __future__ import annotations

import contextlib
import datetime as _dt
import math
import os
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probust import data as _data
from probust import models as _models
from probust._json import jsonable
from probust.models._checkpoint import probust_version

ExtraLoss = Callable[[nn.Module, Tensor, Tensor, Tensor], Tensor]

#: Learning-rate schedules: factor of the base lr as a function of progress t in [0, 1).
SCHEDULES: dict[str, Callable[[float], float]] = {
    "cosine": lambda t: 0.5 * (1.0 + math.cos(math.pi * t)),
    "step": lambda t: 0.1 ** ((t >= 0.5) + (t >= 0.75)),
    "constant": lambda t: 1.0,
}

#: Per-architecture defaults for arguments left as None (measured on this project's data sets;
#: ResNet18's are the usual CIFAR recipe, 200 epochs as in the paper).
DEFAULTS: dict[str, dict[str, Any]] = {
    "linear": {"epochs": 10, "lr": 0.01, "batch_size": 128, "weight_decay": 0.0},
    "cnn": {"epochs": 10, "lr": 0.05, "batch_size": 128, "weight_decay": 5e-4},
    "resnet18": {"epochs": 200, "lr": 0.1, "batch_size": 128, "weight_decay": 5e-4},
    "vit": {"epochs": 10, "lr": 0.01, "batch_size": 64, "weight_decay": 0.0},
}

# What must match for a checkpoint to be resumed (anything else would change the result).
_RESUME_KEYS = (
    "dataset", "arch", "num_classes", "input_shape", "epochs", "lr", "batch_size", "momentum",
    "weight_decay", "schedule", "grad_reg", "seed", "augment", "arch_kwargs", "train_size", "extra_loss",
)  # fmt: skip


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


def input_gradient_penalty(model: nn.Module, x: Tensor, y: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """Cross-entropy and the gradient-norm penalty, both differentiable in the weights.

    Args:
        model: maps ``[B, *input_shape]`` to logits ``[B, C]``.
        x: inputs ``[B, *input_shape]`` in pixel units.
        y: labels ``[B]`` (int64).

    Returns:
        ``(ce, penalty, logits)``: ``ce`` the mean cross-entropy (scalar), ``penalty`` the mean over
        examples of ``||d CE(f(x_i), y_i) / d x_i||_2^2`` (scalar, built with ``create_graph=True``),
        ``logits`` ``[B, C]``. With BatchNorm in training mode an example's loss also depends on
        the rest of its batch; the gradient is then that of the batch's summed loss, as usual.
    """
    x = x.detach().requires_grad_(True)
    logits = model(x)
    per_example = F.cross_entropy(logits, y, reduction="none")
    # Summing keeps each example's own gradient in its row: d(sum_j l_j)/dx_i = dl_i/dx_i.
    (grad,) = torch.autograd.grad(per_example.sum(), x, create_graph=True)
    penalty = grad.flatten(1).pow(2).sum(1).mean()
    return per_example.mean(), penalty, logits


def objective(
    model: nn.Module,
    x: Tensor,
    y: Tensor,
    grad_reg: float = 0.0,
    extra_loss: ExtraLoss | None = None,
) -> tuple[Tensor, Tensor]:
    """The training loss for one batch: CE + grad_reg * penalty (+ extra_loss).

    Returns:
        ``(loss, logits)``: scalar loss to back-propagate, logits ``[B, C]``.
    """
    if grad_reg > 0:
        ce, penalty, logits = input_gradient_penalty(model, x, y)
        loss = ce + grad_reg * penalty
    else:
        logits = model(x)
        loss = F.cross_entropy(logits, y)
    if extra_loss is not None:
        loss = loss + extra_loss(model, x, y, logits)
    return loss, logits


@torch.no_grad()
def evaluate(model: nn.Module, dataset: _data.ImageDataset, device: str | torch.device = "cpu", batch_size: int = 1000) -> float:
    """Top-1 accuracy of ``model`` on ``dataset`` (fraction in [0, 1]); the model's mode is kept."""
    was_training = model.training
    model.eval()
    try:
        X, Y = _tensors(dataset)
        correct = 0
        for start in range(0, len(Y), batch_size):
            xb = X[start : start + batch_size].to(device)
            correct += int((model(xb).argmax(1).cpu() == Y[start : start + batch_size]).sum())
        return correct / max(len(Y), 1)
    finally:
        model.train(was_training)


def resolve_device(device: str | torch.device) -> torch.device:
    """``"auto"`` -> CUDA when available, else CPU; anything else as given (checked)."""
    if str(device) == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"device {device!r} requested but CUDA is not available; use 'cpu' or 'auto'")
    return dev


def _tensors(ds: Any) -> tuple[Tensor, Tensor]:
    if hasattr(ds, "tensors"):
        X, Y = ds.tensors()
    else:  # any map-style data set of (x, label)
        items = [ds[i] for i in range(len(ds))]
        X = torch.stack([torch.as_tensor(x, dtype=torch.float32) for x, _ in items])
        Y = torch.as_tensor([int(y) for _, y in items], dtype=torch.int64)
    return X, Y.to(torch.int64)


def _derive_seed(seed: int, epoch: int) -> int:
    # Distinct, reproducible streams per (seed, epoch): what makes resumption exact.
    return (int(seed) * 1_000_003 + epoch * 7_919 + 12_345) % (2**63 - 1)


def _augment(x: Tensor, gen: torch.Generator, pad: int = 4) -> Tensor:
    """Random crop with zero padding and horizontal flip, per image: the standard CIFAR recipe."""
    b, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    dx = torch.randint(0, 2 * pad + 1, (b,), generator=gen)
    flip = torch.rand(b, generator=gen) < 0.5
    rows = (dy[:, None] + torch.arange(h)[None, :]).to(x.device)
    cols = (dx[:, None] + torch.arange(w)[None, :]).to(x.device)
    cols = torch.where(flip.to(x.device)[:, None], cols.flip(1), cols)
    batch = torch.arange(b, device=x.device)[:, None, None]
    return padded.permute(0, 2, 3, 1)[batch, rows[:, :, None], cols[:, None, :]].permute(0, 3, 1, 2).contiguous()


def _check_args(epochs: int, lr: float, batch_size: int, grad_reg: float, momentum: float, weight_decay: float, schedule: str) -> None:
    if isinstance(epochs, bool) or not isinstance(epochs, int) or epochs < 1:
        raise ValueError(f"epochs must be an integer >= 1, got {epochs!r}")
    if isinstance(batch_size, bool) or not isinstance(batch_size, int) or batch_size < 1:
        raise ValueError(f"batch_size must be an integer >= 1, got {batch_size!r}")
    if not (lr > 0 and math.isfinite(lr)):
        raise ValueError(f"lr must be a positive number, got {lr!r}")
    if not (grad_reg >= 0 and math.isfinite(grad_reg)):
        raise ValueError(f"grad_reg (lambda) must be >= 0, got {grad_reg!r}")
    if not 0 <= momentum < 1:
        raise ValueError(f"momentum must be in [0, 1), got {momentum!r}")
    if not weight_decay >= 0:
        raise ValueError(f"weight_decay must be >= 0, got {weight_decay!r}")
    if schedule not in SCHEDULES:
        raise ValueError(f"unknown schedule {schedule!r}; known schedules: {', '.join(SCHEDULES)}")


def train(
    dataset: str | _data.ImageDataset = "fashion-mnist",
    arch: str = "cnn",
    epochs: int | None = None,
    lr: float | None = None,
    batch_size: int | None = None,
    grad_reg: float = 0.0,
    seed: int = 0,
    out: str | os.PathLike | None = None,
    resume: bool = True,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
    extra_loss: ExtraLoss | None = None,
    *,
    momentum: float = 0.9,
    weight_decay: float | None = None,
    schedule: str = "cosine",
    augment: bool | None = None,
    root: str | os.PathLike | None = None,
    download: bool = False,
    test_dataset: _data.ImageDataset | None = None,
    arch_kwargs: dict[str, Any] | None = None,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None = None,
    num_threads: int | None = None,
) -> TrainResult:
    """Trains a model with SGD, checkpointing every epoch; resumable.

    Args:
        dataset: a name from :data:`probust.data.DATASETS` (both splits are loaded), or an
            :class:`~probust.data.ImageDataset` to train on (then ``test_dataset`` is evaluated).
        arch: a name from :data:`probust.models.ARCHS`.
        epochs, lr, batch_size, weight_decay: None takes :data:`DEFAULTS` for ``arch``.
        grad_reg: lambda of the gradient-norm penalty (see the module docstring); 0 disables it.
        seed: seeds initialisation, shuffling and augmentation.
        out: checkpoint path (``<out>.json`` gets the metadata); None keeps the model in memory only.
        resume: continue from ``out`` if it holds an unfinished run with the same settings, or
            return it as is if finished; False starts over and overwrites it.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"``.
        show_progress: a tqdm bar per epoch with running loss and accuracy.
        extra_loss: ``(model, x, y, logits) -> scalar`` added to every batch's loss. If it has
            ``state_dict()`` / ``load_state_dict()`` (as :class:`~probust.RobustLoss`'s warm-up
            count), that state is checkpointed and restored on resumption.
        momentum: SGD momentum.
        schedule: learning-rate schedule over all steps, one of :data:`SCHEDULES`.
        augment: random crop (pad 4) and horizontal flip; default on for CIFAR only.
        root, download: passed to :func:`probust.data.load`.
        test_dataset: test split when ``dataset`` is a data set object.
        arch_kwargs: extra arguments to :func:`probust.models.build` (e.g. ``pretrained`` for vit);
            the data set's mean/std are used for normalisation unless given here.
        on_epoch_end: called as ``(epoch, meta)`` after each epoch's checkpoint is written.
        num_threads: CPU threads torch may use while training (restored afterwards); None keeps
            torch's setting. On a busy machine 1 can be many times faster than the default.

    Returns:
        :class:`TrainResult` with the model, its meta and the checkpoint path. ``meta`` holds
        dataset, arch, num_classes, input_shape, classes, grad_reg, epochs, epochs_completed, lr,
        batch_size, momentum, weight_decay, schedule, augment, seed, test_accuracy, history (per
        epoch: train loss/accuracy, test accuracy, lr, seconds), train_seconds, device,
        torch_version, probust_version, created, complete; ``extra_loss`` (the loss's
        ``__qualname__``, e.g. a :class:`~probust.RobustLoss`'s repr naming its settings, or None)
        and, when the loss has a ``config()`` method, ``extra_loss_config`` (its result).

    Raises:
        ValueError: unknown names or bad hyper-parameters (before any work).
        probust.data.ProbustDataError: the data set is missing.
        probust.models.CheckpointMismatchError: ``out`` holds a run with other settings and
            ``resume`` is True.
    """
    with _cpu_threads(num_threads):
        return _train(
            dataset, arch, epochs, lr, batch_size, grad_reg, seed, out, resume, device, show_progress,
            extra_loss, momentum, weight_decay, schedule, augment, root, download, test_dataset,
            arch_kwargs, on_epoch_end,
        )  # fmt: skip


@contextlib.contextmanager
def _cpu_threads(num_threads: int | None) -> Iterator[None]:
    if num_threads is None:
        yield
        return
    if isinstance(num_threads, bool) or not isinstance(num_threads, int) or num_threads < 1:
        raise ValueError(f"num_threads must be an integer >= 1, got {num_threads!r}")
    previous = torch.get_num_threads()
    torch.set_num_threads(num_threads)
    try:
        yield
    finally:
        torch.set_num_threads(previous)


def _train(
    dataset: str | _data.ImageDataset,
    arch: str,
    epochs: int | None,
    lr: float | None,
    batch_size: int | None,
    grad_reg: float,
    seed: int,
    out: str | os.PathLike | None,
    resume: bool,
    device: str | torch.device,
    show_progress: bool,
    extra_loss: ExtraLoss | None,
    momentum: float,
    weight_decay: float | None,
    schedule: str,
    augment: bool | None,
    root: str | os.PathLike | None,
    download: bool,
    test_dataset: _data.ImageDataset | None,
    arch_kwargs: dict[str, Any] | None,
    on_epoch_end: Callable[[int, dict[str, Any]], None] | None,
) -> TrainResult:
    _models.check_arch(arch)
    defaults = DEFAULTS[arch]
    epochs = defaults["epochs"] if epochs is None else epochs
    lr = float(defaults["lr"] if lr is None else lr)
    batch_size = defaults["batch_size"] if batch_size is None else batch_size
    weight_decay = float(defaults["weight_decay"] if weight_decay is None else weight_decay)
    grad_reg, momentum = float(grad_reg), float(momentum)
    _check_args(epochs, lr, batch_size, grad_reg, momentum, weight_decay, schedule)
    dev = resolve_device(device)

    name, train_ds, test_ds = _datasets(dataset, test_dataset, root, download)
    augment = name in ("cifar10", "cifar100") if augment is None else bool(augment)
    input_shape = list(train_ds.input_shape)
    kwargs = dict(arch_kwargs or {})
    kwargs.setdefault("mean", list(getattr(train_ds, "mean", [0.0] * input_shape[0])))
    kwargs.setdefault("std", list(getattr(train_ds, "std", [1.0] * input_shape[0])))

    torch.manual_seed(seed)
    try:
        model = _models.build(arch, train_ds.num_classes, input_shape, **kwargs)
    except TypeError as exc:  # an option the architecture does not take
        raise ValueError(f"architecture {arch!r} does not accept the options {sorted(kwargs)}: {exc}") from None
    config: dict[str, Any] = {
        "dataset": name,
        "arch": arch,
        "num_classes": train_ds.num_classes,
        "input_shape": input_shape,
        "arch_kwargs": (_models.spec_of(model) or {}).get("arch_kwargs", {}),
        "classes": list(getattr(train_ds, "classes", [])),
        "epochs": epochs,
        "lr": lr,
        "batch_size": batch_size,
        "momentum": momentum,
        "weight_decay": weight_decay,
        "schedule": schedule,
        "grad_reg": grad_reg,
        "grad_reg_form": "mean_i ||d CE(f(x_i), y_i) / d x_i||^2, x in pixel units",
        "augment": augment,
        "seed": int(seed),
        "train_size": len(train_ds),
        "extra_loss": getattr(extra_loss, "__qualname__", type(extra_loss).__name__) if extra_loss else None,
    }
    # The loss's settings, for readers of the metadata (e.g. the experiments); resumption keeps
    # matching on "extra_loss" alone, so checkpoints written before this key existed still resume.
    config_of = getattr(extra_loss, "config", None)
    if callable(config_of):
        config["extra_loss_config"] = _jsonable(config_of())
    if steps_per_epoch(len(train_ds), batch_size) == 0:
        raise ValueError(f"the training set needs at least 2 examples, it has {len(train_ds)}")
    model.to(dev)
    total_steps = epochs * steps_per_epoch(len(train_ds), batch_size)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=momentum, weight_decay=weight_decay)
    factor = SCHEDULES[schedule]
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: factor(min(step, total_steps - 1) / total_steps))

    path = Path(out) if out is not None else None
    progress: dict[str, Any] = {
        "epochs_completed": 0,
        "history": [],
        "train_seconds": 0.0,
        "created": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }
    if path is not None and resume and path.exists():
        saved = _restore(path, config, model, optimizer, scheduler, extra_loss)
        if saved.get("complete"):
            model.eval()
            return TrainResult(model=model, meta=saved, path=path)
        progress = {k: saved[k] for k in progress}

    X, Y = _tensors(train_ds)
    meta: dict[str, Any] = {}
    for epoch in range(progress["epochs_completed"], epochs):
        t0 = time.perf_counter()
        stats = _run_epoch(
            model, X, Y, optimizer, scheduler, epoch, epochs, seed, batch_size, grad_reg, extra_loss, augment, dev, show_progress
        )
        test_acc = evaluate(model, test_ds, dev) if test_ds is not None else None
        seconds = time.perf_counter() - t0
        progress["epochs_completed"] = epoch + 1
        progress["history"] = progress["history"] + [{"epoch": epoch + 1, **stats, "test_accuracy": test_acc, "seconds": round(seconds, 3)}]
        progress["train_seconds"] = round(progress["train_seconds"] + seconds, 3)
        if show_progress:
            _report(epoch, epochs, stats, test_acc, seconds)
        done = epoch + 1 == epochs
        meta = {
            **config,
            **progress,
            "complete": done,
            "test_accuracy": test_acc,
            "device": str(dev),
            "torch_version": torch.__version__,
            "probust_version": probust_version(),
        }
        if path is not None:
            state = None if done else {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict()}
            if state is not None and callable(getattr(extra_loss, "state_dict", None)):
                state["extra_loss"] = extra_loss.state_dict()  # e.g. RobustLoss's warm-up count
            _models.save_checkpoint(path, model, meta, train_state=state)
        if on_epoch_end is not None:
            on_epoch_end(epoch + 1, meta)
    model.eval()
    return TrainResult(model=model, meta=meta, path=path)


def _jsonable(value: Any) -> Any:
    """``value`` with tensors, numpy scalars and tuples turned into JSON types (checked)."""
    import json

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


def _datasets(
    dataset: str | _data.ImageDataset,
    test_dataset: _data.ImageDataset | None,
    root: str | os.PathLike | None,
    download: bool,
) -> tuple[str, _data.ImageDataset, _data.ImageDataset | None]:
    """(name, train split, test split) from a data set name or objects."""
    if isinstance(dataset, str):
        name = _data.canonical_name(dataset)
        return name, _data.load(name, "train", root=root, download=download), _data.load(name, "test", root=root, download=download)
    return getattr(dataset, "name", "custom"), dataset, test_dataset


def _restore(
    path: Path,
    config: dict[str, Any],
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    extra_loss: ExtraLoss | None = None,
) -> dict[str, Any]:
    """Loads the run saved at ``path`` into model, optimiser, schedule and the extra loss's
    state (when it has ``load_state_dict`` and the checkpoint holds one); returns its meta.

    Raises:
        CheckpointMismatchError: the saved run has other settings than ``config``.
    """
    try:
        payload = _models.read_checkpoint(path, map_location="cpu")
    except _models.CheckpointError as exc:
        raise _models.CheckpointError(f"{exc}; pass resume=False (CLI: --no-resume) to overwrite it") from None
    saved = payload["meta"]
    problems = [
        f"{key}={saved.get(key)!r} there, {config.get(key)!r} asked" for key in _RESUME_KEYS if saved.get(key) != config.get(key)
    ]
    if problems:
        raise _models.CheckpointMismatchError(
            f"{path} holds a run with other settings ({'; '.join(problems)}); "
            "pass resume=False (CLI: --no-resume) to start over, or choose another --out"
        )
    model.load_state_dict(payload["state_dict"])
    if not saved.get("complete"):
        optimizer.load_state_dict(payload["train_state"]["optimizer"])
        scheduler.load_state_dict(payload["train_state"]["scheduler"])
        loss_state = payload["train_state"].get("extra_loss")
        if loss_state is not None and callable(getattr(extra_loss, "load_state_dict", None)):
            extra_loss.load_state_dict(loss_state)
    return saved


def steps_per_epoch(n: int, batch_size: int) -> int:
    """Optimiser steps in one epoch over n examples at ``batch_size`` (what warm-ups count)."""
    full, rest = divmod(n, batch_size)
    return full + (rest > 1)  # a last batch of one is dropped: BatchNorm cannot train on it


def _run_epoch(
    model: nn.Module,
    X: Tensor,
    Y: Tensor,
    optimizer: torch.optim.Optimizer,
    scheduler: Any,
    epoch: int,
    epochs: int,
    seed: int,
    batch_size: int,
    grad_reg: float,
    extra_loss: ExtraLoss | None,
    augment: bool,
    device: torch.device,
    show_progress: bool,
) -> dict[str, float]:
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
            if augment:
                xb = _augment(xb, gen)
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
            optimizer.zero_grad(set_to_none=True)
            loss, logits = objective(model, xb, yb, grad_reg, extra_loss)
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
