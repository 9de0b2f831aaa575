"""The arguments of one ``probust estimate`` run: :class:`RunSettings`, checked when it is built.

:func:`probust.run.run_estimate` takes these arguments by keyword and builds a :class:`RunSettings`;
:func:`probust.run.prepare` takes one. Every bad value raises :class:`~probust.run.ConfigError`
with a one-line message that starts with the argument's name (the CLI maps it to its flag).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from probust._stats import INTERVALS
from probust.estimators import MMSE
from probust.estimators.pruning import PRUNE_CHOICES
from probust.execution.budget import check_budget
from probust.execution.tuning import JACOBIANS
from probust.run.errors import ConfigError
from probust.run.indices import parse_indices
from probust.run.methods import DEFAULT_METHODS, METHODS
from probust.run.sources import device_type

__all__ = ["MMSE_SAMPLINGS", "TARGETS", "RunSettings"]

TARGETS = ("prediction", "label")
MMSE_SAMPLINGS = MMSE.SAMPLINGS


@dataclass(frozen=True, kw_only=True)
class RunSettings:
    """Every argument of a run, checked and normalised when the object is built.

    Sequences are stored as sorted tuples (``sigmas``, ``mc_samples``, ``mmse_samples``,
    ``indices``; ``methods`` in ``probust.METHODS`` order), numbers as int or float.

    Attributes:
        data: a data set name (``probust.data.DATASETS``) or a Dataset with
            ``ds[i] -> (x float32 [C, H, W], label)`` (``name``, ``classes``, ``subset`` and
            ``tensors`` are used when present).
        model: a model file (probust checkpoint, TorchScript, torch.export) or an ``nn.Module``
            mapping [B, C, H, W] to logits [B, num_classes] (moved to ``device``; its
            state_dict's sha256 identifies it).
        sigmas: noise standard deviations per input coordinate, in the units of x (> 0).
        methods: any of ``probust.METHODS``; default the paper's six (:data:`DEFAULT_METHODS`).
        out: the results folder (see :mod:`probust.run.store`).
        split: "train" or "test" (for a named data set).
        mc_samples: Monte Carlo draws per point (mc, mc_cv, mc_is); several values give one
            row each.
        mmse_samples: MMSE noisy copies per point; several values give one row each (mmse,
            mmse_mvs). The MMSE linearisation inside mc_cv and mc_is uses the first once sorted,
            i.e. the smallest; to extend a folder holding mc_cv or mc_is rows, keep it the same.
        limit: score only the first ``limit`` selected points.
        indices: points to score: ints or strings like "0-99", "0-999:10" (inclusive ranges).
        device: "cpu", "cuda", "cuda:N" or "auto" (cuda if available); under torchrun on
            GPUs each rank uses cuda:LOCAL_RANK.
        seed: seed of every random stream (each point's stream depends on it and the index).
        batch_size: points per work unit: per estimator call and per part file.
        eval_batch_size: most inputs per forward pass inside the estimators; default
            each estimator's own.
        memory_budget: bytes (or a size such as "4GB") each estimator may hold at once;
            default half the memory free on the device. Row and class chunks are chosen to fit.
        jacobian: how the analytic methods get input gradients: "auto" (measured once per
            model), "loop", "vmap" or "forward" (see :class:`probust.Taylor`).
        channels_last: run convolutional models in channels_last memory format (True), or
            not (False); None: measured. With ``eval_batch_size`` and ``jacobian`` it fixes
            the execution plan, for tables identical to the bit on any machine.
        temperature: softmax temperature of the "softmax" method.
        target: "prediction" (p of keeping the clean prediction, the paper's definition) or
            "label" (p of predicting the true class).
        tol: absolute error tolerance of the mvn-cdf ("taylor", "mmse", and the linearisation
            inside "mc_cv" and "mc_is").
        ci_level: level of the Monte Carlo confidence interval.
        interval: "wilson" or "clopper-pearson" (method "mc"; "mc_cv" and "mc_is" give their
            own intervals at ``ci_level``, see :class:`probust.MonteCarloCV` and
            :class:`probust.MonteCarloIS`).
        mmse_sampling: "centred" or "iid" (see :class:`probust.MMSE`).
        p_fail: also compute the failure probability 1 - p directly, with relative accuracy,
            for the analytic methods (taylor, mmse, taylor_mvs, mmse_mvs; columns ``p_fail``
            and ``p_fail_error``, see :func:`probust.run.store.read_results`). Free for the
            mv-sigmoid; for the mvn-cdf up to C - 1 extra QMC integrals per point, so off by
            default. ``mc_is`` always fills these columns. A run setting: a folder computed
            without it cannot be extended with it (use another ``out``, or ``overwrite``).
        prune: decision boundaries the analytic mvn-cdf methods (taylor, mmse) may skip: "auto"
            (default: skip those that cannot matter from 1,000 classes on, see
            :class:`probust.Taylor`), "on" or "off" (every boundary's gradient, as before). The
            error of the skipped ones is added to ``cdf_error``; the column
            ``boundaries_kept`` records how many each point kept. A run setting, part of the
            folder's identity.
        mc_half_width: adaptive Monte Carlo ("mc", "mc_cv"): stop drawing for a point once its
            interval's half-width is at most this (checked every 1,000 draws for "mc", 500 for
            "mc_cv"; at most ``mc_samples`` draws). The column ``n_drawn`` records the draws
            used. A run setting, part of the folder's identity. None: always ``mc_samples``.
        show_progress: a progress bar per (sigma, method, sample count).
        overwrite: replace the results of a different run in ``out``.
        extend: add this grid (more points, sigmas, methods, sample counts) to a folder holding
            results of the same data, model and settings.
        merge: compact the parts into ``results.parquet`` at the end.
        download: fetch a missing data set.
        data_root: folder holding the data sets.
        allow_pickle: accept model files that run code when loaded (pickled modules).

    Raises:
        ConfigError: a bad value (one line, starting with the argument's name).
    """

    data: str | Any
    model: str | os.PathLike | nn.Module
    sigmas: Sequence[float]
    methods: Sequence[str] = DEFAULT_METHODS
    out: str | os.PathLike = "results"
    split: str = "test"
    mc_samples: Sequence[int] = (10_000,)
    mmse_samples: Sequence[int] = (5,)
    limit: int | None = None
    indices: Sequence[int] | None = None
    device: str | torch.device = "auto"
    seed: int = 0
    batch_size: int = 256
    eval_batch_size: int | None = None
    memory_budget: int | str | None = None
    jacobian: str = "auto"
    channels_last: bool | None = None
    temperature: float = 1.0
    target: str = "prediction"
    tol: float = 1e-4
    ci_level: float = 0.95
    interval: str = "wilson"
    mmse_sampling: str = "centred"
    p_fail: bool = False
    mc_half_width: float | None = None
    prune: str = "auto"
    show_progress: bool = True
    overwrite: bool = False
    extend: bool = False
    merge: bool = True
    download: bool = False
    data_root: str | os.PathLike | None = None
    allow_pickle: bool = False

    def __post_init__(self) -> None:
        for name, value in _checked(self).items():
            object.__setattr__(self, name, value)

    @property
    def selected(self) -> np.ndarray | None:
        """``indices`` as int64 [P] (sorted, unique), or None when none were given."""
        return None if self.indices is None else np.asarray(self.indices, dtype=np.int64)

    def replace(self, **changes: Any) -> RunSettings:
        """A copy with some arguments changed (checked again)."""
        return dataclasses.replace(self, **changes)


def _checked(s: RunSettings) -> dict[str, Any]:
    """The normalised value of every argument, checked in the order the arguments are listed
    (so that the first bad one is reported)."""
    out: dict[str, Any] = {
        "sigmas": _check_sigmas(s.sigmas),
        "methods": _check_methods(s.methods),
        "mc_samples": _check_counts(s.mc_samples, "mc_samples"),
        "mmse_samples": _check_counts(s.mmse_samples, "mmse_samples"),
        "limit": _check_int(s.limit, "limit", 1),
        "batch_size": _check_int(s.batch_size, "batch_size", 1),
        "eval_batch_size": _check_int(s.eval_batch_size, "eval_batch_size", 1),
    }
    try:
        check_budget(s.memory_budget)
    except ValueError as exc:
        raise ConfigError(f"memory_budget: {exc}") from None
    if s.channels_last is not None and not isinstance(s.channels_last, bool):
        raise ConfigError(f"channels_last: expected True, False or None (measured), got {s.channels_last!r}")
    if s.jacobian not in JACOBIANS:
        raise ConfigError(f"jacobian: expected one of {', '.join(JACOBIANS)}, got {s.jacobian!r}")
    if isinstance(s.seed, bool) or not isinstance(s.seed, (int, np.integer)):
        raise ConfigError(f"seed: must be an integer, got {s.seed!r}")
    out["seed"] = int(s.seed)
    out["temperature"] = _check_positive(s.temperature, "temperature")
    out["tol"] = _check_positive(s.tol, "tol")
    ci_level = _check_number(s.ci_level, "ci_level")
    if not 0 < ci_level < 1:
        raise ConfigError(f"ci_level: must be in (0, 1), got {ci_level}")
    out["ci_level"] = ci_level
    for value, allowed, name in (
        (s.target, TARGETS, "target"),
        (s.interval, INTERVALS, "interval"),
        (s.mmse_sampling, MMSE_SAMPLINGS, "mmse_sampling"),
    ):
        if value not in allowed:
            raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    if not isinstance(s.p_fail, (bool, np.bool_)):
        raise ConfigError(f"p_fail: must be True or False, got {s.p_fail!r}")
    out["p_fail"] = bool(s.p_fail)
    mc_half_width = s.mc_half_width
    if mc_half_width is not None:
        mc_half_width = _check_positive(mc_half_width, "mc_half_width")
        if mc_half_width >= 0.5:
            raise ConfigError(f"mc_half_width: must be below 0.5 (a half-width of a probability), got {mc_half_width}")
    out["mc_half_width"] = mc_half_width
    if s.prune not in PRUNE_CHOICES:
        raise ConfigError(f"prune: expected one of {', '.join(PRUNE_CHOICES)}, got {s.prune!r}")
    if s.prune == "on" and s.p_fail:
        raise ConfigError(
            "prune: 'on' cannot be combined with p_fail=True (use 'auto', which keeps every boundary then)"
        )
    if s.overwrite and s.extend:
        raise ConfigError("overwrite=True and extend=True exclude each other")
    out["indices"] = None if s.indices is None else tuple(int(i) for i in parse_indices(s.indices))
    device_type(s.device)
    if s.split not in ("train", "test") and isinstance(s.data, (str, os.PathLike)):
        raise ConfigError(f"split: expected train or test, got {s.split!r}")
    if s.out is None:
        raise ConfigError("out: give an output folder")
    return out


def _check_sigmas(sigmas: float | Iterable[float]) -> tuple[float, ...]:
    values = [sigmas] if isinstance(sigmas, (int, float, str)) else list(sigmas)
    if not values:
        raise ConfigError("sigmas: give at least one noise level")
    out = []
    for v in values:
        try:
            s = float(v)
        except (TypeError, ValueError):
            raise ConfigError(f"sigmas: {v!r} is not a number") from None
        if not np.isfinite(s) or s <= 0:
            raise ConfigError(f"sigmas: noise levels must be positive finite numbers, got {v}")
        out.append(s)
    return tuple(sorted(set(out)))


def _check_methods(methods: str | Iterable[str]) -> tuple[str, ...]:
    values = [methods] if isinstance(methods, str) else list(methods)
    if not values:
        raise ConfigError("methods: give at least one method")
    unknown = [m for m in values if m not in METHODS]
    if unknown:
        raise ConfigError(f"methods: unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    return tuple(m for m in METHODS if m in values)


def _check_counts(values: int | Iterable[int], name: str) -> tuple[int, ...]:
    values = [values] if isinstance(values, (int, str)) else list(values)
    if not values:
        raise ConfigError(f"{name}: give at least one sample count")
    out = []
    for v in values:
        try:
            n = int(v)
        except (TypeError, ValueError):
            raise ConfigError(f"{name}: {v!r} is not an integer") from None
        if isinstance(v, float) and v != n or n < 1:
            raise ConfigError(f"{name}: sample counts must be integers >= 1, got {v}")
        out.append(n)
    return tuple(sorted(set(out)))


def _check_number(value: Any, name: str) -> float:
    try:
        return float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a number") from None


def _check_positive(value: float, name: str) -> float:
    v = _check_number(value, name)
    if not np.isfinite(v) or v <= 0:
        raise ConfigError(f"{name}: must be a positive number, got {value}")
    return v


def _check_int(value: int | None, name: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)
