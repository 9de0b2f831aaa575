"""The training settings: one frozen :class:`TrainConfig`, checked when it is built.

A field left as None takes the per-architecture value of :data:`DEFAULTS` when training starts
(:meth:`TrainConfig.for_arch`). Both are read by :func:`probust.training.train`, the ``probust
train`` command and the demo.

Example:
    >>> config = TrainConfig(epochs=3, grad_reg=1e-3)
    >>> probust.training.train("fashion-mnist", "cnn", config=config)
"""

from __future__ import annotations

import dataclasses
import json
import math
import numbers
import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, ClassVar

import torch

from probust._options import declared, option
from probust.data import DATASETS
from probust.errors import OptionError
from probust.models import ARCHS, check_arch

#: Learning-rate schedules: factor of the base lr as a function of progress t in [0, 1).
SCHEDULES: dict[str, Callable[[float], float]] = {
    "cosine": lambda t: 0.5 * (1.0 + math.cos(math.pi * t)),
    "step": lambda t: 0.1 ** ((t >= 0.5) + (t >= 0.75)),
    "constant": lambda t: 1.0,
}

#: The fields of :class:`TrainConfig` whose None means "the architecture's value".
ARCH_DEFAULTED = ("epochs", "lr", "batch_size", "weight_decay")


@dataclass(frozen=True)
class TrainConfig:
    """How a model is trained: SGD with momentum, a per-step schedule, optional gradient penalty.

    Every field is a keyword argument of :func:`probust.training.train` of the same name.

    Attributes:
        epochs: passes over the training set (>= 1); None: :data:`DEFAULTS` for the architecture.
        lr: base learning rate (> 0); None: per architecture.
        batch_size: examples per step (>= 1); None: per architecture.
        weight_decay: SGD weight decay (>= 0); None: per architecture.
        momentum: SGD momentum, in [0, 1).
        schedule: learning-rate schedule over all steps, one of :data:`SCHEDULES`.
        grad_reg: lambda of the gradient-norm penalty (>= 0; see :mod:`probust.training.objectives`);
            0 disables it.
        seed: seeds initialisation, shuffling, augmentation and randomness inside the model.
        augment: random crop (pad 4) and horizontal flip; None: on for CIFAR only.
        arch_kwargs: extra arguments to :func:`probust.models.build` (e.g. ``pretrained`` for vit);
            the data set's mean/std are used for normalisation unless given here. Stored as a copy.
        num_threads: CPU threads torch may use while training (restored afterwards); None keeps
            torch's setting. On a busy machine 1 can be many times faster than the default.
        device: ``"cpu"``, ``"cuda"``, ``"cuda:1"``, or ``"auto"`` (CUDA when available).

    Each field is declared once (:func:`probust._options.option`): ``probust train``'s flags and
    their help are derived from the declarations.

    Raises:
        OptionError: a bad value (a ValueError; its ``field`` is the argument of ``train`` of that name).
    """

    TITLE: ClassVar[str] = "training (None: the architecture's value, see DEFAULTS)"

    epochs: int | None = option(None, help="passes over the training set", default_help="per architecture", parse=int)
    lr: float | None = option(None, help="base (initial) learning rate", default_help="per architecture", parse=float)
    batch_size: int | None = option(None, help="examples per step", default_help="per architecture", parse=int)
    weight_decay: float | None = option(None, help="SGD weight decay", default_help="per architecture", parse=float)
    momentum: float = option(0.9, help="SGD momentum, in [0, 1)", parse=float)
    schedule: str = option(
        "cosine", help=f"learning-rate schedule over all steps: {', '.join(SCHEDULES)}", metavar="NAME"
    )
    grad_reg: float = option(
        0.0,
        help="lambda of the gradient-norm penalty (>= 0; 0 disables it); the paper uses 0, 1e-4, 1e-3, 1e-2",
        metavar="LAMBDA",
        parse=float,
    )
    seed: int = option(
        0, help="seeds initialisation, shuffling, augmentation and randomness inside the model", parse=int
    )
    augment: bool | None = option(None, help="random crop (pad 4) and horizontal flip", default_help="CIFAR only")
    arch_kwargs: Mapping[str, Any] | None = dataclasses.field(
        default=None,
        hash=False,
        metadata=option(
            None,
            help="architecture options as a JSON object, e.g. '{\"pool\": false}' or '{\"dropout\": 0.25}' for "
            'cnn, \'{"config": {"hidden_size": 192}}\' for vit (the data set\'s mean/std normalise the input '
            "unless given here)",
            default_help="",
            metavar="JSON",
            parse=json.loads,
        ).metadata,
    )
    num_threads: int | None = option(
        None,
        help="CPU threads torch may use while training (restored afterwards); on a busy machine 1 can be many "
        "times faster",
        default_help="torch's setting",
        flag="--threads",
        metavar="N",
        parse=int,
    )
    device: str | torch.device = option("cpu", help="cpu, cuda, cuda:N or auto (CUDA when available)")

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise OptionError(f"must be an integer >= 1, got {value!r}", field=name)
        if self.lr is not None and not (_real(self.lr, "lr") > 0 and math.isfinite(self.lr)):
            raise OptionError(f"must be a positive number, got {self.lr!r}", field="lr")
        if not (_real(self.grad_reg, "grad_reg") >= 0 and math.isfinite(self.grad_reg)):
            raise OptionError(f"(lambda) must be >= 0, got {self.grad_reg!r}", field="grad_reg")
        if not 0 <= _real(self.momentum, "momentum") < 1:
            raise OptionError(f"must be in [0, 1), got {self.momentum!r}", field="momentum")
        if self.weight_decay is not None and not _real(self.weight_decay, "weight_decay") >= 0:
            raise OptionError(f"must be >= 0, got {self.weight_decay!r}", field="weight_decay")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise OptionError(
                f"unknown schedule {self.schedule!r}; known schedules: {', '.join(SCHEDULES)}", field="schedule"
            )
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise OptionError(f"must be an integer, got {self.seed!r}", field="seed")
        if self.arch_kwargs is not None and not isinstance(self.arch_kwargs, Mapping):
            raise OptionError(
                f"must be a dict of options for probust.models.build, got {self.arch_kwargs!r}", field="arch_kwargs"
            )
        if str(self.device) != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError, ValueError):
                raise OptionError(
                    f"must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {self.device!r}", field="device"
                ) from None
        # The same conversions train() has always applied, done once here.
        for name in ("lr", "weight_decay", "grad_reg", "momentum"):
            value = getattr(self, name)
            if value is not None:
                object.__setattr__(self, name, float(value))
        if self.augment is not None:
            object.__setattr__(self, "augment", bool(self.augment))
        if self.arch_kwargs is not None:
            object.__setattr__(self, "arch_kwargs", dict(self.arch_kwargs))

    def for_arch(self, arch: str) -> TrainConfig:
        """This config with its None :data:`ARCH_DEFAULTED` fields taken from ``DEFAULTS[arch]``.

        Raises:
            ValueError: ``arch`` is not a name from :data:`probust.models.ARCHS`.
        """
        check_arch(arch)
        filled = {name: DEFAULTS[arch][name] for name in ARCH_DEFAULTED if getattr(self, name) is None}
        return dataclasses.replace(self, **filled)


def _optional_path(value: Any, name: str) -> Any:
    if value is not None and not isinstance(value, (str, os.PathLike)):
        raise OptionError(f"expected a folder (a str or a path), got {value!r}", field=name)
    return value


def _flag(value: Any, name: str) -> bool:
    if not isinstance(value, bool):
        raise OptionError(f"must be True or False, got {value!r}", field=name)
    return value


def _optional_name(value: Any, name: str) -> str | None:
    if value is not None and not isinstance(value, str):
        raise OptionError(f"expected a checkpoint name or folder, got {value!r}", field=name)
    return value


def _text(value: Any, name: str) -> str:
    if not isinstance(value, (str, os.PathLike)) or not str(value):
        raise OptionError(f"expected a name or a path, got {value!r}", field=name)
    return str(value)


def _optional_text(value: Any, name: str) -> str | None:
    return None if value is None else _text(value, name)


def _architecture(value: Any, name: str) -> str:
    try:
        return check_arch(_text(value, name))
    except ValueError as exc:
        raise OptionError(str(exc), field=name) from None


@dataclass(frozen=True, kw_only=True)
class TrainRun:
    """What ``probust train`` trains and where it writes, declared once (its flags are derived
    from these): the data (a built-in data set's name or the user's files), the architecture and
    the checkpoint. :func:`probust.training.train` takes the same as its arguments.

    Raises:
        OptionError: a bad value (``field`` names the option).
    """

    TITLE: ClassVar[str] = "what to train"

    data: str = option(
        help=f"data set: {', '.join(DATASETS)}; or your own training data, a tensor file, a table or a folder of "
        "images (as for probust estimate; e.g. --arch mlp for a table)",
        metavar="NAME|PATH",
        check=_text,
    )
    test_data: str | None = option(
        None,
        help="the test split of your own data, read like --data (a built-in data set brings its own)",
        default_help="none",
        metavar="PATH",
        check=_optional_text,
    )
    arch: str = option(help=f"architecture: {', '.join(ARCHS)}", metavar="ARCH", check=_architecture)
    out: str = option(help="checkpoint to write, e.g. models/fmnist_cnn.pt", metavar="PATH", check=_text)
    show_progress: bool = option(True, help="no progress bar or summary", flag="--quiet", check=_flag)

    def __post_init__(self) -> None:
        for f, o in declared(self):
            if o.check is not None:
                object.__setattr__(self, f.name, o.check(getattr(self, f.name), f.name))


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """The other options of a training run, declared once: :func:`probust.training.train`'s
    ``root``, ``download`` and ``resume``, and ``pretrained``, vit's ``arch_kwargs`` key (a
    Hugging Face checkpoint to fine-tune). ``probust train``'s flags are derived from them.

    Raises:
        OptionError: a bad value (``field`` names the option).
    """

    TITLE: ClassVar[str] = "data and checkpoint"

    root: str | os.PathLike | None = option(
        None,
        help="data folder",
        default_help="$PROBUST_DATA_DIR or ~/.cache/probust/data",
        metavar="DIR",
        check=_optional_path,
    )
    download: bool = option(False, help="download the data set if it is not found locally", check=_flag)
    resume: bool = option(True, help="start over even if --out holds a run", flag="--no-resume", check=_flag)
    pretrained: str | None = option(
        None,
        help="vit only: pretrained Hugging Face checkpoint to fine-tune",
        default_help="",
        metavar="NAME_OR_DIR",
        check=_optional_name,
    )

    def __post_init__(self) -> None:
        for f, o in declared(self):
            if o.check is not None:
                object.__setattr__(self, f.name, o.check(getattr(self, f.name), f.name))


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise OptionError(f"must be a number, got {value!r}", field=name)
    return float(value)


# Per-architecture recipes (their provenance: docs/training.md), checked like any other config.
_RECIPES: dict[str, TrainConfig] = {
    "linear": TrainConfig(epochs=10, lr=0.01, batch_size=128, weight_decay=0.0),
    "cnn": TrainConfig(epochs=10, lr=0.05, batch_size=128, weight_decay=5e-4),
    "resnet18": TrainConfig(epochs=200, lr=0.1, batch_size=128, weight_decay=5e-4),
    "vit": TrainConfig(epochs=10, lr=0.01, batch_size=64, weight_decay=0.0),
    # Small tables (hundreds of rows): many short epochs; the MLP standardises its features.
    "mlp": TrainConfig(epochs=100, lr=0.01, batch_size=32, weight_decay=1e-4),
}

#: Per-architecture values of the :data:`ARCH_DEFAULTED` fields, for a :class:`TrainConfig` that
#: leaves them as None: ``DEFAULTS[arch][name]``.
DEFAULTS: dict[str, dict[str, Any]] = {
    arch: {name: getattr(recipe, name) for name in ARCH_DEFAULTED} for arch, recipe in _RECIPES.items()
}
