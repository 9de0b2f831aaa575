"""The training objective and the accuracy check, for one batch or one data set.

The objective for a batch of ``B`` examples is::

    mean_i CE(f(x_i), y_i)  +  lambda * mean_i || d CE(f(x_i), y_i) / d x_i ||_2^2  [+ extra_loss]

``d CE / d x_i`` is taken in the units of ``x`` (pixels in [0, 1], before the model's
normalisation layer), those of the noise ``sigma``, with ``create_graph=True`` so that the
penalty's own gradient reaches the weights (double backpropagation; docs/training.md).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from probust import data as _data
from probust._inputs import batch, check_labels, check_x

#: ``(model, x, y, logits) -> scalar`` added to every batch's loss (e.g. a :class:`RobustLoss`).
ExtraLoss = Callable[[nn.Module, Tensor, Tensor, Tensor], Tensor]


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
def evaluate(
    model: nn.Module, dataset: _data.ImageDataset, device: str | torch.device = "cpu", batch_size: int = 1000
) -> float:
    """Top-1 accuracy of ``model`` on ``dataset`` (fraction in [0, 1]); the model's mode is kept."""
    was_training = model.training
    model.eval()
    try:
        X, Y = dataset_tensors(dataset, field="test_dataset")
        correct = 0
        for start in range(0, len(Y), batch_size):
            xb = X[start : start + batch_size].to(device)
            correct += int((model(xb).argmax(1).cpu() == Y[start : start + batch_size]).sum())
        return correct / max(len(Y), 1)
    finally:
        model.train(was_training)


def dataset_tensors(ds: Any, classes: int | None = None, field: str = "dataset") -> tuple[Tensor, Tensor]:
    """``(X float32 [N, ...], Y int64 [N])`` of a data set, read and checked as every entry point
    reads data (:mod:`probust._inputs`: items ``(x, label)``; integer, NaN or inf inputs and labels
    outside [0, ``classes``) refused with an error naming ``field``)."""
    n = len(ds)
    X, Y = batch(ds, np.arange(n), field)
    return check_x(X, field), check_labels(Y, n, classes, field=field)
