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
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch

from probust.models import check_arch

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

    Raises:
        ValueError: a bad value, naming the field (the argument of ``train`` of that name).
    """

    epochs: int | None = None
    lr: float | None = None
    batch_size: int | None = None
    weight_decay: float | None = None
    momentum: float = 0.9
    schedule: str = "cosine"
    grad_reg: float = 0.0
    seed: int = 0
    augment: bool | None = None
    arch_kwargs: Mapping[str, Any] | None = field(default=None, hash=False)
    num_threads: int | None = None
    device: str | torch.device = "cpu"

    def __post_init__(self) -> None:
        for name in ("epochs", "batch_size", "num_threads"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name} must be an integer >= 1, got {value!r}")
        if self.lr is not None and not (_real(self.lr, "lr") > 0 and math.isfinite(self.lr)):
            raise ValueError(f"lr must be a positive number, got {self.lr!r}")
        if not (_real(self.grad_reg, "grad_reg") >= 0 and math.isfinite(self.grad_reg)):
            raise ValueError(f"grad_reg (lambda) must be >= 0, got {self.grad_reg!r}")
        if not 0 <= _real(self.momentum, "momentum") < 1:
            raise ValueError(f"momentum must be in [0, 1), got {self.momentum!r}")
        if self.weight_decay is not None and not _real(self.weight_decay, "weight_decay") >= 0:
            raise ValueError(f"weight_decay must be >= 0, got {self.weight_decay!r}")
        if not isinstance(self.schedule, str) or self.schedule not in SCHEDULES:
            raise ValueError(f"unknown schedule {self.schedule!r}; known schedules: {', '.join(SCHEDULES)}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, numbers.Integral):
            raise ValueError(f"seed must be an integer, got {self.seed!r}")
        if self.arch_kwargs is not None and not isinstance(self.arch_kwargs, Mapping):
            raise ValueError(
                f"arch_kwargs must be a dict of options for probust.models.build, got {self.arch_kwargs!r}"
            )
        if str(self.device) != "auto":
            try:
                torch.device(self.device)
            except (RuntimeError, TypeError, ValueError):
                raise ValueError(f"device must be 'cpu', 'cuda', 'cuda:N' or 'auto', got {self.device!r}") from None
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


def _real(value: Any, name: str) -> float:
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise ValueError(f"{name} must be a number, got {value!r}")
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
