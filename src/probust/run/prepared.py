"""A validated run (:class:`PreparedRun`), its grid (:class:`Task`) and what executing it did (:class:`RunSummary`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from probust.estimators import DEFAULT_COPIES
from probust.run.distributed import World
from probust.run.store import ResultStore

__all__ = ["PreparedRun", "RunSummary", "Task"]


@dataclass(frozen=True)
class Task:
    """One (sigma, method, sample count) of the grid; ``n_samples`` is 0 where unused."""

    sigma: float
    method: str
    n_samples: int

    @property
    def key(self) -> tuple[float, str, int]:
        return (self.sigma, self.method, self.n_samples)

    def describe(self) -> str:
        return f"sigma={self.sigma:g} {self.method}" + (f" n={self.n_samples}" if self.n_samples else "")


@dataclass
class PreparedRun:
    """A validated run, ready for :func:`~probust.run.execute` (built by :func:`~probust.run.prepare`).

    Attributes:
        store: the results folder.
        dataset: the data set, ``ds[i] -> (x float32 [C, H, W], label)``.
        model: the classifier, on ``device``.
        device: where the model runs.
        indices: int64 [P], the selected points' indices in the data set, sorted, unique.
        tasks: the grid, in the order it is computed: :class:`Task` (sigma, method, sample count)
            for ``probust estimate``; anything with ``key`` (the layout's grid key) and
            ``describe()`` for another command.
        config: what ``config.json`` records.
        world: the processes sharing the run.
        settings: the run's :class:`~probust.run.RunSettings` (or another command's settings).
        show_progress: progress bars (``settings.show_progress`` on the main process only).
        linearisation_samples: copies of the MMSE linearisation of mc_cv and mc_is (the
            smallest ``mmse_samples``).
        warnings: notes about the model or data to show before the run.
        noise: the run's noise (:class:`~probust.run.noise_options.NoiseSetting`); None:
            Gaussian with standard deviation sigma per coordinate.
    """

    store: ResultStore
    dataset: Any
    model: nn.Module
    device: torch.device
    indices: np.ndarray
    tasks: list[Any]
    config: dict[str, Any]
    world: World
    settings: Any  # a RunSettings, or another command's settings (CertifySettings)
    show_progress: bool = True
    linearisation_samples: int = DEFAULT_COPIES
    warnings: list[str] = field(default_factory=list)
    noise: Any = None

    def blocks(self) -> list[np.ndarray]:
        """The selected indices cut into consecutive blocks of ``settings.unit_size``."""
        size = self.settings.unit_size
        return [self.indices[i : i + size] for i in range(0, len(self.indices), size)]


@dataclass
class RunSummary:
    """What :func:`~probust.run.execute` did.

    Attributes:
        path: the results folder.
        rows_computed: rows this process computed now.
        rows_present: rows of this run's grid that were already stored when it started (all ranks).
        rows_total: rows of this run's grid.
        seconds: wall time of :func:`~probust.run.execute`.
        merged: the merged ``results.parquet``, or None when the parts were kept.
    """

    path: Path
    rows_computed: int
    rows_present: int
    rows_total: int
    seconds: float
    merged: Path | None
