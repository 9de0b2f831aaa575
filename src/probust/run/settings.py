"""The arguments of one ``probust estimate`` run: :class:`RunSettings`, checked when it is built.

:func:`probust.run.run_estimate` takes these arguments by keyword and builds a :class:`RunSettings`;
:func:`probust.run.prepare` takes one. Every bad value raises :class:`~probust.run.ConfigError`
with a one-line message that starts with the argument's name (the CLI maps it to its flag).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from probust._stats import INTERVALS
from probust.estimators import MMSE, REGISTRY
from probust.estimators.pruning import PRUNE_CHOICES
from probust.execution.budget import check_budget
from probust.execution.tuning import JACOBIANS
from probust.run.errors import ConfigError
from probust.run.indices import parse_indices
from probust.run.methods import DEFAULT_METHODS, METHODS
from probust.run.noise_options import check_noise
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
        data: a data set name (``probust.data.DATASETS``), a path to the user's own data (a
            tensor file, a table or a folder of images; see ``data_options`` and
            :func:`probust.data.load_file`), or a Dataset with
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
            "label" (p of predicting the true class). With "prediction" a point to compute
            whose clean prediction is tied (two equal largest logits) stops the run before
            any estimate (:class:`~probust.run.TiedPredictionError`), as the estimators refuse
            a tie when no target is given.
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
            (default: skip those that cannot matter where it pays: through the model's linear
            head, or by a sketch from 1,000 classes on, see :class:`probust.Taylor`), "on" or
            "off" (every margin's gradient by its own backward pass, as before). The
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
        allow_version_change: resume or extend ``out`` although another probust version wrote
            its rows (refused by default: the two versions' rows could differ; recorded in the
            folder's history). A folder in another results format is always refused.
        data_options: how to read ``data`` when it is a file or folder rather than a built-in
            name: the fields of :class:`probust.data.FileOptions` (``x_key``, ``y_key``,
            ``label_column``, ``feature_columns``, ``image_size``, ``channels``).
        weights: a state_dict file loaded into the model built by a factory ``model`` given as
            ``"package.module:function"``.
        noise: "gaussian" (default), "uniform" or "laplace": the noise at each sigma, with
            standard deviation sigma per coordinate (mc_cv and mc_is need "gaussian").
        noise_std: a ``.npy`` file (or array) broadcastable to one input's shape: coordinate j
            gets standard deviation ``sigma * noise_std[j]`` (a multiplier of each sigma).
        noise_cov: a ``.npy`` file (or array) [d, d] over the flattened input: the noise has
            covariance ``sigma**2 * noise_cov``.
        noise_scale: "absolute" (default) or "std": sigma times each coordinate's standard
            deviation over the whole data set (for tables: sigma in units of each feature's spread).
        The noise is part of the folder's identity (``config.json`` "run" -> "noise"); see
        :mod:`probust.run.noise_options`.

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
    allow_version_change: bool = False
    data_options: Any = None
    weights: str | os.PathLike | None = None
    noise: str = "gaussian"
    noise_std: Any = None
    noise_cov: Any = None
    noise_scale: str = "absolute"

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
    (so that the first bad one is reported). A value of the wrong type is a ConfigError too."""
    _check_data(s.data)
    _check_model(s.model)
    out: dict[str, Any] = {
        "sigmas": _check_sigmas(s.sigmas),
        "methods": _check_methods(s.methods),
    }
    if s.out is None:
        raise ConfigError("out: give an output folder")
    _check_path(s.out, "out")
    if not isinstance(s.split, str) or (s.split not in ("train", "test") and isinstance(s.data, (str, os.PathLike))):
        raise ConfigError(f"split: expected train or test, got {s.split!r}")
    out["mc_samples"] = _check_counts(s.mc_samples, "mc_samples")
    out["mmse_samples"] = _check_counts(s.mmse_samples, "mmse_samples")
    out["limit"] = _check_int(s.limit, "limit", 1)
    out["indices"] = None if s.indices is None else tuple(int(i) for i in parse_indices(s.indices))
    if not isinstance(s.device, (str, torch.device)):
        raise ConfigError(f"device: expected cpu, cuda, cuda:N or auto, got {s.device!r}")
    device_type(s.device)
    if isinstance(s.seed, bool) or not isinstance(s.seed, (int, np.integer)):
        raise ConfigError(f"seed: must be an integer, got {s.seed!r}")
    out["seed"] = int(s.seed)
    if s.batch_size is None:
        raise ConfigError("batch_size: must be an integer >= 1, got None")
    out["batch_size"] = _check_int(s.batch_size, "batch_size", 1)
    out["eval_batch_size"] = _check_int(s.eval_batch_size, "eval_batch_size", 1)
    try:
        check_budget(s.memory_budget)
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"memory_budget: {str(exc).removeprefix('memory_budget ')}") from None
    if not isinstance(s.jacobian, str) or s.jacobian not in JACOBIANS:
        raise ConfigError(f"jacobian: expected one of {', '.join(JACOBIANS)}, got {s.jacobian!r}")
    if s.channels_last is not None and not isinstance(s.channels_last, bool):
        raise ConfigError(f"channels_last: expected True, False or None (measured), got {s.channels_last!r}")
    out["temperature"] = _check_positive(s.temperature, "temperature")
    _check_choice(s.target, TARGETS, "target")
    out["tol"] = _check_positive(s.tol, "tol")
    ci_level = _check_number(s.ci_level, "ci_level")
    if not 0 < ci_level < 1:
        raise ConfigError(f"ci_level: must be in (0, 1), got {ci_level}")
    out["ci_level"] = ci_level
    _check_choice(s.interval, INTERVALS, "interval")
    _check_choice(s.mmse_sampling, MMSE_SAMPLINGS, "mmse_sampling")
    out["p_fail"] = _check_bool(s.p_fail, "p_fail")
    mc_half_width = s.mc_half_width
    if mc_half_width is not None:
        mc_half_width = _check_positive(mc_half_width, "mc_half_width")
        if mc_half_width >= 0.5:
            raise ConfigError(f"mc_half_width: must be below 0.5 (a half-width of a probability), got {mc_half_width}")
    out["mc_half_width"] = mc_half_width
    for name in ("show_progress", "overwrite", "extend", "merge", "download"):
        out[name] = _check_bool(getattr(s, name), name)
    if s.data_root is not None:
        _check_path(s.data_root, "data_root")
    for name in ("allow_pickle", "allow_version_change"):
        out[name] = _check_bool(getattr(s, name), name)
    if s.prune not in PRUNE_CHOICES:
        raise ConfigError(f"prune: expected one of {', '.join(PRUNE_CHOICES)}, got {s.prune!r}")
    if s.prune == "on" and s.p_fail:
        raise ConfigError(
            "prune: 'on' cannot be combined with p_fail=True (use 'auto', which keeps every boundary then)"
        )
    if out["overwrite"] and out["extend"]:
        raise ConfigError("overwrite=True and extend=True exclude each other")
    if s.data_options is not None and not isinstance(s.data_options, Mapping):
        raise ConfigError(f"data_options: expected a dict of file reading options, got {s.data_options!r}")
    if s.weights is not None:
        _check_path(s.weights, "weights")
    for name in ("noise_std", "noise_cov"):
        value = getattr(s, name)
        if value is not None and not isinstance(value, (str, os.PathLike, np.ndarray, torch.Tensor, list, tuple)):
            raise ConfigError(f"{name}: expected a .npy file or an array, got {value!r}")
    check_noise(
        s.noise, s.noise_std, s.noise_cov, s.noise_scale, [m for m in out["methods"] if REGISTRY[m].needs_gaussian]
    )
    return out


def _check_data(data: Any) -> None:
    if isinstance(data, (str, os.PathLike)):
        return
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__") or isinstance(data, bytes):
        raise ConfigError(
            f"data: expected a data set name or a Dataset with ds[i] -> (x, label) and len(ds), got {data!r}"
        )


def _check_model(model: Any) -> None:
    if not isinstance(model, (str, os.PathLike, nn.Module)):
        raise ConfigError(f"model: expected a path to a model file or a torch.nn.Module, got {model!r}")


def _check_path(value: Any, name: str) -> None:
    if not isinstance(value, (str, os.PathLike)):
        raise ConfigError(f"{name}: expected a folder (a str or a path), got {value!r}")


def _check_bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"{name}: must be True or False, got {value!r}")
    return bool(value)


def _check_choice(value: Any, allowed: Sequence[str], name: str) -> None:
    if not isinstance(value, str) or value not in allowed:
        raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")


def _items(values: Any, name: str, what: str) -> list[Any]:
    """A scalar as a one-item list, or the items of a list, tuple, array, ...; anything else is refused."""
    if isinstance(values, (torch.Tensor, np.ndarray)):
        values = values.tolist()
    if isinstance(values, (str, int, float, np.number)):
        return [values]
    if isinstance(values, (bytes, dict)) or not isinstance(values, Iterable):
        raise ConfigError(f"{name}: expected {what} or a list of them, got {values!r}")
    return list(values)


def _check_sigmas(sigmas: Any) -> tuple[float, ...]:
    values = _items(sigmas, "sigmas", "a noise level")
    if not values:
        raise ConfigError("sigmas: give at least one noise level")
    out = []
    for v in values:
        s = _check_number(v, "sigmas", f"{v!r} is not a number")
        if not np.isfinite(s) or s <= 0:
            raise ConfigError(f"sigmas: noise levels must be positive finite numbers, got {v}")
        out.append(s)
    return tuple(sorted(set(out)))


def _check_methods(methods: Any) -> tuple[str, ...]:
    values = _items(methods, "methods", "a method name")
    if not values:
        raise ConfigError("methods: give at least one method")
    unknown = [m for m in values if not isinstance(m, str) or m not in METHODS]
    if unknown:
        raise ConfigError(f"methods: unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    return tuple(m for m in METHODS if m in values)


def _check_counts(values: Any, name: str) -> tuple[int, ...]:
    items = _items(values, name, "a sample count")
    if not items:
        raise ConfigError(f"{name}: give at least one sample count")
    out = []
    for v in items:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, str, np.number)):
            raise ConfigError(f"{name}: {v!r} is not an integer")
        try:
            n = int(v)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{name}: {v!r} is not an integer") from None
        if isinstance(v, (float, np.floating)) and v != n or n < 1:
            raise ConfigError(f"{name}: sample counts must be integers >= 1, got {v}")
        out.append(n)
    return tuple(sorted(set(out)))


def _check_number(value: Any, name: str, message: str = "") -> float:
    """``value`` as a float: a number (not a bool) or a string holding one (as the CLI gives)."""
    bad = message or f"{value!r} is not a number"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, str, np.number)):
        raise ConfigError(f"{name}: {bad}")
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(f"{name}: {bad}") from None


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
