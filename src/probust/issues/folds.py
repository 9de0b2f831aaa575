"""Which model scores which point: the fold bookkeeping of :func:`probust.find_issues`, and K-fold
training of a model factory (:func:`train_folds`).

A point is scored *out of sample* by the model of the fold that held it out, and *in sample* by
the model that trained on every point (when one is given for the points no fold holds out).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probust._progress import progress
from probust.run import ConfigError

__all__ = ["IN_SAMPLE", "Assignment", "assign", "train_folds"]

#: The ``fold`` of a point scored by the model given as ``model`` (no fold holds it out).
IN_SAMPLE = -1


@dataclass(frozen=True)
class Assignment:
    """The models and the points each scores.

    Attributes:
        models: one per part; ``models[k]`` scores the points ``indices[k]``.
        indices: int64 arrays of data-set indices, disjoint, each sorted.
        fold: int64 [N], the part of each point: k for ``folds[k]``, :data:`IN_SAMPLE` for ``model``.
    """

    models: list[nn.Module]
    indices: list[np.ndarray]
    fold: np.ndarray


def _indices(held_out: Any, n: int, k: int) -> np.ndarray:
    where = f"folds[{k}]'s held-out indices"
    if isinstance(held_out, Tensor):
        held_out = held_out.detach().cpu().numpy()
    array = np.asarray(held_out)
    if array.dtype == bool:
        if array.shape != (n,):
            raise ConfigError(
                f"{where}: a boolean mask must have the data set's {n} entries, got {list(array.shape)}", field="folds"
            )
        array = np.flatnonzero(array)
    if array.ndim != 1 or (array.size and not np.issubdtype(array.dtype, np.integer)):
        raise ConfigError(
            f"{where}: expected a 1-d list or tensor of integer indices, got {array.dtype} {list(array.shape)}",
            field="folds",
        )
    array = array.astype(np.int64)
    if array.size == 0:
        raise ConfigError(f"{where}: empty (each fold holds out at least one point)", field="folds")
    bad = array[(array < 0) | (array >= n)]
    if bad.size:
        raise ConfigError(f"{where}: {int(bad[0])} is not an index of the data set's {n} points", field="folds")
    unique = np.unique(array)
    if unique.size != array.size:
        raise ConfigError(f"{where}: index {int(_first_repeat(array))} appears twice", field="folds")
    return unique


def _first_repeat(array: np.ndarray) -> int:
    values, counts = np.unique(array, return_counts=True)
    return int(values[counts > 1][0])


def assign(n: int, model: nn.Module | None, folds: Sequence[tuple[nn.Module, Any]] | None) -> Assignment:
    """Which model scores each of ``n`` points.

    Args:
        n: the data set's size.
        model: scores every point no fold holds out (all of them without folds).
        folds: ``[(model_k, held_out_k), ...]``: ``model_k`` did not train on the data-set indices
            ``held_out_k`` (a list, an int tensor or array, or a boolean mask [N]) and scores them.

    Raises:
        ConfigError: (field ``folds``) a fold that is not a pair, indices out of range or repeated,
            two folds holding out the same point, or points that no fold holds out and no
            ``model`` scores; (field ``model``) neither given.
    """
    fold = np.full(n, IN_SAMPLE, dtype=np.int64)
    models: list[nn.Module] = []
    parts: list[np.ndarray] = []
    for k, pair in enumerate(folds or ()):
        if not (isinstance(pair, (tuple, list)) and len(pair) == 2 and isinstance(pair[0], nn.Module)):
            raise ConfigError(
                f"folds[{k}]: expected a pair (model, held-out indices), got {type(pair).__name__}", field="folds"
            )
        held = _indices(pair[1], n, k)
        taken = fold[held] != IN_SAMPLE
        if taken.any():
            point = int(held[taken][0])
            raise ConfigError(
                f"folds[{k}] and folds[{int(fold[point])}] both hold out point {point}: each point is scored by "
                "the one model that did not train on it, so the folds' held-out sets must not overlap",
                field="folds",
            )
        fold[held] = k
        models.append(pair[0])
        parts.append(held)
    rest = np.flatnonzero(fold == IN_SAMPLE)
    if rest.size:
        if model is None:
            if not parts:
                raise ConfigError("give a model, or folds=[(model, held-out indices), ...]", field="model")
            raise ConfigError(
                f"{rest.size} of the {n} points (the first: {int(rest[0])}) are held out by no fold and no model is "
                "given to score them: cover every point with the folds, or pass model= (it scores the rest "
                "in sample)",
                field="folds",
            )
        models.append(model)
        parts.append(rest)
    return Assignment(models, parts, fold)


def train_folds(
    factory: Callable[[], nn.Module],
    x: Tensor,
    labels: Tensor,
    k: int = 5,
    *,
    epochs: int = 10,
    lr: float = 1e-3,
    batch_size: int = 128,
    weight_decay: float = 0.0,
    seed: int = 0,
    device: str | torch.device = "cpu",
    show_progress: bool = True,
) -> list[tuple[nn.Module, np.ndarray]]:
    """K models of ``factory``, each trained on all points but one fold's: the ``folds`` argument of
    :func:`probust.find_issues` (cleanlab's out-of-sample setting: K trainings).

    Each model trains with Adam on the cross-entropy of the given labels (the points of its
    training part reshuffled every epoch from ``seed``); the folds are a seeded permutation cut into
    ``k`` parts of sizes that differ by at most one. Deterministic on the CPU for a given seed. The
    inputs stay where they are; each batch moves to ``device``.

    Args:
        factory: returns a fresh, untrained model mapping [B, *S] to logits [B, C].
        x: float32 [N, *S] inputs, in the units the model takes; labels: int64 [N] (the given ones).
        k: the number of folds (>= 2).
        epochs, lr, batch_size, weight_decay: Adam's settings, the same for every fold.
        seed: of the fold split, the initialisations (``torch.manual_seed(seed + fold)``) and the shuffling.
        device: where the models train (and are returned).
        show_progress: one bar over the k trainings' epochs.

    Returns:
        ``[(model_k, held_out_k), ...]``: ``model_k`` in eval mode, ``held_out_k`` sorted int64 indices.
    """
    if k < 2:
        raise ConfigError(f"must be at least 2, got {k}", field="k")
    if len(x) != len(labels) or len(x) < k:
        raise ConfigError(
            f"expected at least k = {k} points with one label each, got x {list(x.shape)} and labels {list(labels.shape)}",
            field="labels",
        )
    order = np.random.default_rng(seed).permutation(len(x))
    parts = [np.sort(part) for part in np.array_split(order, k)]
    labels = labels.to(torch.int64)
    trained = []
    with progress(k * epochs, f"training {k} folds", show_progress, unit="epoch") as bar:
        for fold, held in enumerate(parts):
            keep = np.setdiff1d(np.arange(len(x)), held)
            fitted = _fit(
                factory, x[keep], labels[keep], epochs, lr, batch_size, weight_decay, seed + fold, device, bar
            )
            trained.append((fitted, held))
    return trained


def _fit(factory, x, y, epochs, lr, batch_size, weight_decay, seed, device, bar) -> nn.Module:
    torch.manual_seed(seed)
    model = factory().to(device)
    optimiser = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=weight_decay)
    shuffle = torch.Generator().manual_seed(seed)
    model.train()
    for _ in range(epochs):
        for batch in torch.randperm(len(x), generator=shuffle).split(batch_size):
            loss = nn.functional.cross_entropy(model(x[batch].to(device)), y[batch].to(device))
            optimiser.zero_grad()
            loss.backward()
            optimiser.step()
        bar.update(1)
    return model.eval()
