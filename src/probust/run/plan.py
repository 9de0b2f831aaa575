"""A validated run (:class:`RunPlan`), its grid (:class:`Task`) and what executing it did (:class:`RunSummary`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from probust.run.distributed import World
from probust.run.store import ResultStore

__all__ = ["RunPlan", "RunSummary", "Task"]


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
class RunPlan:
    """A validated run, ready for :func:`~probust.run.execute` (built by :func:`~probust.run.prepare`).

    Attributes:
        store: the results folder.
        dataset: the data set, ``ds[i] -> (x float32 [C, H, W], label)``.
        model: the classifier, on ``device``.
        device: where the model runs.
        indices: int64 [P], the selected points' indices in the data set, sorted, unique.
        tasks: the (sigma, method, sample count) grid, in the order it is computed.
        config: what ``config.json`` records.
        world: the processes sharing the run.
        linearisation_samples: copies of the MMSE linearisation of mc_cv and mc_is (the
            smallest ``mmse_samples``).
        noise: the run's noise (:class:`~probust.run.noise_options.NoiseSetting`); None:
            Gaussian with standard deviation sigma per coordinate.

    The other attributes are the :class:`~probust.run.RunSettings` of the same names.
    """

    store: ResultStore
    dataset: Any
    model: nn.Module
    device: torch.device
    indices: np.ndarray
    tasks: list[Task]
    config: dict[str, Any]
    world: World
    batch_size: int
    eval_batch_size: int | None
    memory_budget: int | str | None
    jacobian: str
    channels_last: bool | None
    seed: int
    target: str
    temperature: float
    tol: float
    ci_level: float
    interval: str
    mmse_sampling: str
    show_progress: bool
    merge: bool
    p_fail: bool = False
    mc_half_width: float | None = None
    prune: str = "auto"
    linearisation_samples: int = 5
    warnings: list[str] = field(default_factory=list)
    noise: Any = None

    def blocks(self) -> list[np.ndarray]:
        """The selected indices cut into consecutive blocks of ``batch_size``."""
        return [self.indices[i : i + self.batch_size] for i in range(0, len(self.indices), self.batch_size)]


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
