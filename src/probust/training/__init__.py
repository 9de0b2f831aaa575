"""Training the paper's models: the loop, its settings, objectives and the robust loss.

* :func:`train` (:mod:`~probust.training.loop`): SGD with a per-step schedule, a checkpoint per
  epoch, resumable; settings as keywords or one :class:`TrainConfig`.
* :class:`TrainConfig`, :class:`TrainRun`, :class:`TrainOptions`, :data:`DEFAULTS`, :data:`SCHEDULES`
  (:mod:`~probust.training.config`).
* :func:`objective`, :func:`input_gradient_penalty`, :func:`evaluate`
  (:mod:`~probust.training.objectives`): cross-entropy plus the gradient-norm penalty.
* :class:`RobustLoss` (:mod:`~probust.training.robust_loss`): ``mu * mean(-log p_robust)``;
  :class:`RobustLossOptions`, the same as ``probust train``'s options.
* :mod:`~probust.training.checkpointing`: what a run records and how it resumes.

Example:
    >>> from probust.training import TrainConfig, train
    >>> result = train("fashion-mnist", "cnn", config=TrainConfig(epochs=3), out="models/fmnist_cnn.pt")
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from probust.training.checkpointing import RESUME_KEYS
    from probust.training.config import DEFAULTS, SCHEDULES, TrainConfig, TrainOptions, TrainRun
    from probust.training.loop import TrainResult, resolve_device, steps_per_epoch, train
    from probust.training.objectives import ExtraLoss, evaluate, input_gradient_penalty, objective
    from probust.training.robust_loss import RobustLoss, RobustLossOptions

# name -> module defining it. Loaded on first use: the loop pulls in the data sets and models
# (torchvision), which ``import probust`` (it exports RobustLoss) does not need.
_WHERE = {
    "RESUME_KEYS": "checkpointing",
    "DEFAULTS": "config",
    "SCHEDULES": "config",
    "TrainConfig": "config",
    "TrainOptions": "config",
    "TrainRun": "config",
    "TrainResult": "loop",
    "resolve_device": "loop",
    "steps_per_epoch": "loop",
    "train": "loop",
    "ExtraLoss": "objectives",
    "evaluate": "objectives",
    "input_gradient_penalty": "objectives",
    "objective": "objectives",
    "RobustLoss": "robust_loss",
    "RobustLossOptions": "robust_loss",
}


def __getattr__(name: str) -> Any:
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module 'probust.training' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"probust.training.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *_WHERE])


__all__ = [
    "DEFAULTS",
    "RESUME_KEYS",
    "SCHEDULES",
    "ExtraLoss",
    "RobustLoss",
    "RobustLossOptions",
    "TrainConfig",
    "TrainOptions",
    "TrainResult",
    "TrainRun",
    "evaluate",
    "input_gradient_penalty",
    "objective",
    "resolve_device",
    "steps_per_epoch",
    "train",
]
