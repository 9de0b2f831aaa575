"""The arguments of one ``probust estimate`` run: :class:`RunSettings`, checked when it is built.

Each argument is declared once, as a field with an :class:`~probust._options.Option` (its help,
unit, flag, choices, check, and whether ``config.json`` records it), in the group of the layer
that uses it: :class:`DataOptions` (what is scored), :class:`NoiseOptions`,
:class:`EstimatorOptions` (what the estimators compute: recorded, part of a folder's identity),
:class:`ExecutionOptions` (how they run: never changes a number) and :class:`FolderOptions`
(the results folder). :class:`RunSettings` composes them. The ``probust estimate`` flags and
their help, the recorded settings and their defaults, the estimators' keyword arguments and the
error-to-flag map are all derived from these declarations.

:func:`probust.run.run_estimate` takes these arguments by keyword and builds a :class:`RunSettings`;
:func:`probust.run.prepare` takes one. Every bad value raises :class:`~probust.run.ConfigError`
(a :class:`probust.errors.OptionError`) whose ``field`` is the argument's name.
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch
from torch import nn

from probust._options import UNSET, declared, option
from probust.errors import OptionError, Setting
from probust.estimators import (
    DEFAULT_CONFIDENCE,
    DEFAULT_COPIES,
    DEFAULT_DRAWS,
    GRADIENTS,
    INTERVALS,
    METHODS,
    MMSE,
    PAPER_METHODS,
    PRUNE_CHOICES,
    REGISTRY,
    RUN_OPTIONS,
    check_settings,
)
from probust.execution import JACOBIANS, check_budget
from probust.mvn import DEFAULT_TOL
from probust.run.errors import ConfigError
from probust.run.indices import parse_indices
from probust.run.methods import DEFAULT_METHODS
from probust.run.noise_options import DEFAULT_DESCRIPTION, NOISE_KINDS, NOISE_SCALES, check_noise
from probust.run.sources import as_dataset, device_type

__all__ = [
    "GROUPS",
    "MMSE_SAMPLINGS",
    "SETTING_DEFAULTS",
    "TARGETS",
    "ComputeOptions",
    "DataOptions",
    "EstimatorOptions",
    "ExecutionOptions",
    "FolderOptions",
    "NoiseOptions",
    "RunSettings",
    "SeedOptions",
    "SourceOptions",
    "check_declared",
    "check_keywords",
    "estimator_parameters",
    "model_argument",
    "recorded",
]

TARGETS = ("prediction", "label")
MMSE_SAMPLINGS = MMSE.SAMPLINGS


# --- checks: check(value, name) -> the normalised value; a ConfigError whose field is name -----


def _path(optional: bool, what: str = "a folder") -> Any:
    def check(value: Any, name: str) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"expected {what} (a str or a path), got {value!r}", field=name)
        return value

    return check


def _bool(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"must be True or False, got {value!r}", field=name)
    return bool(value)


def _choice(allowed: Sequence[str]) -> Any:
    def check(value: Any, name: str) -> Any:
        if not isinstance(value, str) or value not in allowed:
            raise ConfigError(f"expected one of {', '.join(allowed)}, got {value!r}", field=name)
        return value

    return check


def _items(values: Any, name: str, what: str) -> list[Any]:
    """A scalar as a one-item list, or the items of a list, tuple, array, ...; anything else is refused."""
    if isinstance(values, (torch.Tensor, np.ndarray)):
        values = values.tolist()
    if isinstance(values, (str, int, float, np.number)):
        return [values]
    if isinstance(values, (bytes, dict)) or not isinstance(values, Iterable):
        raise ConfigError(f"expected {what} or a list of them, got {values!r}", field=name)
    return list(values)


def _number(value: Any, name: str, message: str = "") -> float:
    """``value`` as a float: a number (not a bool) or a string holding one (as the CLI gives)."""
    bad = message or f"{value!r} is not a number"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, str, np.number)):
        raise ConfigError(bad, field=name)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(bad, field=name) from None


def _positive(value: Any, name: str) -> float:
    v = _number(value, name)
    if not np.isfinite(v) or v <= 0:
        raise ConfigError(f"must be a positive number, got {value}", field=name)
    return v


def _integer(minimum: int | None, optional: bool) -> Any:
    def check(value: Any, name: str) -> int | None:
        if value is None and optional:
            return None
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, np.integer)):
            if minimum is None:
                raise ConfigError(f"must be an integer, got {value!r}", field=name)
            raise ConfigError(f"must be an integer >= {minimum}, got {value!r}", field=name)
        if minimum is not None and value < minimum:
            raise ConfigError(f"must be an integer >= {minimum}, got {value!r}", field=name)
        return int(value)

    return check


def _sigmas(sigmas: Any, name: str) -> tuple[float, ...]:
    values = _items(sigmas, name, "a noise level")
    if not values:
        raise ConfigError("give at least one noise level", field=name)
    out = []
    for v in values:
        s = _number(v, name, f"{v!r} is not a number")
        if not np.isfinite(s) or s <= 0:
            raise ConfigError(f"noise levels must be positive finite numbers, got {v}", field=name)
        out.append(s)
    return tuple(sorted(set(out)))


def _methods(methods: Any, name: str) -> tuple[str, ...]:
    values = _items(methods, name, "a method name")
    if not values:
        raise ConfigError("give at least one method", field=name)
    unknown = [m for m in values if not isinstance(m, str) or m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}", field=name)
    return tuple(m for m in METHODS if m in values)


def _counts(values: Any, name: str) -> tuple[int, ...]:
    items = _items(values, name, "a sample count")
    if not items:
        raise ConfigError("give at least one sample count", field=name)
    out = []
    for v in items:
        if isinstance(v, (bool, np.bool_)) or not isinstance(v, (int, float, str, np.number)):
            raise ConfigError(f"{v!r} is not an integer", field=name)
        try:
            n = int(v)
        except (TypeError, ValueError, OverflowError):
            raise ConfigError(f"{v!r} is not an integer", field=name) from None
        if isinstance(v, (float, np.floating)) and v != n or n < 1:
            raise ConfigError(f"sample counts must be integers >= 1, got {v}", field=name)
        out.append(n)
    return tuple(sorted(set(out)))


def _split(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"expected train or test, got {value!r}", field=name)
    return value


def _indices(value: Any, name: str) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(i) for i in parse_indices(value))


def _data(data: Any, name: str) -> Any:
    if isinstance(data, (str, os.PathLike)):
        return data
    # A DataLoader's data set (checked to be read as the loader reads it), tensors as a data set.
    data = as_dataset(data)
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__") or isinstance(data, bytes):
        raise ConfigError(
            f"expected a data set name or a Dataset with ds[i] -> (x, label) and len(ds), got {data!r}", field=name
        )
    return data


def _model(model: Any, name: str) -> Any:
    if not isinstance(model, (str, os.PathLike, nn.Module)):
        raise ConfigError(f"expected a path to a model file or a torch.nn.Module, got {model!r}", field=name)
    return model


def model_argument(text: str) -> tuple[str, Any]:
    """``"KEY=VALUE"`` as ``(KEY, VALUE)``: VALUE read as a JSON literal (``3``, ``0.5``,
    ``true``, ``null``, ``[1, 2]``, ``"text"``), else kept as the string it is."""
    key, eq, value = text.partition("=")
    if not eq or not key.strip().isidentifier():
        raise ValueError(f"expected KEY=VALUE with KEY a Python name, got {text!r}")
    try:
        return key.strip(), json.loads(value)
    except ValueError:
        return key.strip(), value


def _model_args(value: Any, name: str) -> dict[str, Any]:
    """A dict of keyword arguments (or ``KEY=VALUE`` strings / pairs) whose values JSON can record."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Mapping):
        pairs = []
        for item in _items(value, name, "KEY=VALUE"):
            try:
                pairs.append(model_argument(item) if isinstance(item, str) else tuple(item))
            except (TypeError, ValueError) as exc:
                raise ConfigError(str(exc), field=name) from None
        value = dict(pairs)
    out = {}
    for key, v in value.items():
        if not isinstance(key, str) or not key.isidentifier():
            raise ConfigError(f"keyword names must be Python names, got {key!r}", field=name)
        try:
            json.dumps(v)
        except (TypeError, ValueError):
            raise ConfigError(
                f"{key}: values must be numbers, strings, booleans, None or lists/dicts of them, got {v!r}", field=name
            ) from None
        out[key] = v
    return out


def _device(value: Any, name: str) -> Any:
    if not isinstance(value, (str, torch.device)):
        raise ConfigError(f"expected cpu, cuda, cuda:N or auto, got {value!r}", field=name)
    device_type(value)
    return value


def _budget(value: Any, name: str) -> Any:
    try:
        check_budget(value)
    except OptionError as exc:
        raise ConfigError(*exc.parts, field=name) from None
    return value


def _channels_last(value: Any, name: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"expected True, False or None (measured), got {value!r}", field=name)
    return value


def _level(value: Any, name: str) -> float:
    level = _number(value, name)
    if not 0 < level < 1:
        raise ConfigError(f"must be in (0, 1), got {level}", field=name)
    return level


def _half_width(value: Any, name: str) -> float | None:
    if value is None:
        return None
    width = _positive(value, name)
    if width >= 0.5:
        raise ConfigError(f"must be below 0.5 (a half-width of a probability), got {width}", field=name)
    return width


def _mapping(what: str) -> Any:
    def check(value: Any, name: str) -> Any:
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"expected {what}, got {value!r}", field=name)
        return value

    return check


def _array(value: Any, name: str) -> Any:
    if value is not None and not isinstance(value, (str, os.PathLike, np.ndarray, torch.Tensor, list, tuple)):
        raise ConfigError(f"expected a .npy file or an array, got {value!r}", field=name)
    return value


def _statistics(positive: bool) -> Any:
    """A normalisation statistic (``mean``, ``std``): None, or finite numbers (``std``: positive)
    as a tuple of floats, one per channel or one for all."""

    def check(value: Any, name: str) -> tuple[float, ...] | None:
        if value is None:
            return None
        items = _items(value, name, "a number")
        if not items:
            raise ConfigError("give one value per channel, or one for all", field=name)
        out = []
        for item in items:
            v = _number(item, name)
            if not np.isfinite(v) or (positive and v <= 0):
                raise ConfigError(f"must be {'positive' if positive else 'finite'} numbers, got {item}", field=name)
            out.append(v)
        return tuple(out)

    return check


def _check_normalization(settings: Any) -> None:
    """``mean`` and ``std`` have the same length, or one of them has one value."""
    mean, std = getattr(settings, "mean", None), getattr(settings, "std", None)
    if mean is not None and std is not None and len(mean) != len(std) and 1 not in (len(mean), len(std)):
        raise ConfigError(
            f"has {len(std)} values and ", Setting("mean"), f" {len(mean)}: give one per channel to both", field="std"
        )


def _named(methods: Iterable[str]) -> str:
    return ", ".join(methods)


def _with(run_option: str) -> str:
    return _named(name for name, spec in REGISTRY.items() if run_option in spec.run_options)


def _sampled(kind: str) -> str:
    return _named(name for name, spec in REGISTRY.items() if spec.samples == kind)


# --- the declarations ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class SourceOptions:
    """What is scored: the data, the model, the points and the noise levels (``probust estimate``
    and ``probust certify`` alike)."""

    TITLE: ClassVar[str] = "what to score"

    data: str | Any = option(
        help="a built-in data set (mnist, fashion-mnist, cifar10, cifar100, digits), or your own: a tensor file "
        "(.npz, .pt, .npy: inputs [N, ...] and integer labels [N]), a table (.parquet, .csv: one row per point) "
        "or a folder of images in one subfolder per class; from Python also a Dataset with "
        "ds[i] -> (x float32 [C, H, W], label)",
        metavar="NAME|PATH",
        check=_data,
    )
    model: str | os.PathLike | nn.Module = option(
        help="probust checkpoint, TorchScript file or torch.export (.pt2) file; package.module:function "
        "returning an nn.Module (called with --model-arg's keyword arguments; the current folder is searched "
        "first); or hf:FOLDER, a Hugging Face image classifier saved with save_pretrained (probust[hf]); from "
        "Python also an nn.Module mapping [B, C, H, W] to logits [B, num_classes] (its state_dict's sha256 "
        "identifies it)",
        metavar="FILE",
        check=_model,
    )
    model_args: Mapping[str, Any] = option(
        None,
        help="a keyword argument of the function of --model package.module:function, as KEY=VALUE (VALUE read "
        "as a JSON literal: 3, 0.5, true, null, [1, 2], else as text), e.g. num_classes=3; repeat for several. "
        "Recorded in config.json, part of the folder's identity",
        default_help="",
        flag="--model-arg",
        metavar="KEY=VALUE",
        repeat=True,
        parse=model_argument,
        check=_model_args,
        record="model_args",
        implied={},
    )
    weights: str | os.PathLike | None = option(
        None,
        help="state_dict file loaded into the model built by --model package.module:function",
        default_help="",
        metavar="FILE",
        check=_path(True, "a state_dict file"),
    )
    allow_pickle: bool = option(
        False,
        help="accept model and weights files that run code when loaded (torch.save(model), a torch.export "
        "archive with pickled parts); see docs/security.md",
        check=_bool,
    )
    mean: Sequence[float] | None = option(
        None,
        help="the per-channel means of the normalisation the model expects (e.g. ImageNet's 0.485 0.456 0.406, "
        "a timm model's pretrained_cfg): the model is scored on (x - mean) / std, so the data and sigma stay "
        "in pixel units; one value per channel, or one for all. Recorded in config.json",
        default_help="0",
        metavar="M",
        many=True,
        check=_statistics(False),
        record="mean",
        implied=None,
    )
    std: Sequence[float] | None = option(
        None,
        help="the per-channel standard deviations of that normalisation (e.g. ImageNet's 0.229 0.224 0.225); "
        "positive. Recorded in config.json",
        default_help="1",
        metavar="S",
        many=True,
        check=_statistics(True),
        record="std",
        implied=None,
    )
    sigmas: Sequence[float] = option(
        help="noise standard deviations per input coordinate, in the units of x (pixel units, [0, 1] scale for images)",
        flag="--sigma",
        metavar="S",
        many=True,
        check=_sigmas,
    )
    split: str = option(
        "test",
        help="data set split (a built-in data set): train or test",
        choices=("train", "test"),
        check=_split,
    )
    limit: int | None = option(
        None,
        help="score only the first N selected points",
        default_help="",
        metavar="N",
        parse=int,
        check=_integer(1, True),
    )
    indices: Sequence[int] | None = option(
        None,
        help="points to score: N, A-B (inclusive), A-B:STEP, comma- or space-separated",
        default_help="all",
        metavar="SPEC",
        many=True,
        check=_indices,
    )
    data_root: str | os.PathLike | None = option(
        None,
        help="folder holding the data sets",
        default_help="$PROBUST_DATA_DIR or ~/.cache/probust/data",
        metavar="DIR",
        check=_path(True),
    )
    download: bool = option(False, help="download the data set if it is not on this machine", check=_bool)
    data_options: Mapping[str, Any] | None = option(
        None,
        help="how to read data when it is a file or folder: the fields of probust.data.FileOptions (x_key, "
        "y_key, label_column, feature_columns, image_size, channels; each its own flag)",
        flag="--data",
        hidden=True,
        check=_mapping("a dict of file reading options"),
    )

    @property
    def selected(self) -> np.ndarray | None:
        """``indices`` as int64 [P] (sorted, unique), or None when none were given."""
        return None if self.indices is None else np.asarray(self.indices, dtype=np.int64)


@dataclass(frozen=True, kw_only=True)
class DataOptions(SourceOptions):
    """What ``probust estimate`` scores: the points, noise levels, methods and sample counts."""

    methods: Sequence[str] = option(
        DEFAULT_METHODS,
        help=f"any of {' '.join(METHODS)}",
        default_help=f"the paper's six, {' '.join(PAPER_METHODS)}",
        metavar="M",
        many=True,
        check=_methods,
    )
    mc_samples: Sequence[int] = option(
        (DEFAULT_DRAWS,),
        help=f"Monte Carlo draws per point ({_sampled('mc')}); several values give one row each, for "
        "convergence studies",
        metavar="M",
        many=True,
        parse=int,
        check=_counts,
    )
    mmse_samples: Sequence[int] = option(
        (DEFAULT_COPIES,),
        help=f"MMSE noisy copies per point; several values give one row each ({_sampled('mmse')}); the MMSE "
        f"linearisation of {_with('mmse_samples')} uses the smallest (to extend a folder holding their rows, "
        "keep it the same)",
        metavar="N",
        many=True,
        parse=int,
        check=_counts,
    )


@dataclass(frozen=True, kw_only=True)
class NoiseOptions:
    """The noise at each sigma (see :mod:`probust.run.noise_options`); its description is part of
    a folder's identity (``config.json`` "run" -> "noise")."""

    TITLE: ClassVar[str] = "noise (default: Gaussian, standard deviation sigma per coordinate)"

    noise: str = option(
        "gaussian",
        help=f"the noise at each sigma, with standard deviation sigma per coordinate ({_named(NOISE_KINDS)}; "
        f"{_named(n for n, s in REGISTRY.items() if s.needs_gaussian)} need gaussian)",
        choices=NOISE_KINDS,
        record="noise",
        implied=DEFAULT_DESCRIPTION,
    )
    noise_std: Any = option(
        None,
        help="a .npy file (or array) of per-coordinate multipliers m, broadcast to one input's shape: "
        "coordinate j gets standard deviation sigma * m[j] (Gaussian)",
        default_help="",
        metavar="FILE.npy",
        check=_array,
    )
    noise_cov: Any = option(
        None,
        help="a .npy file (or array) holding a covariance C [d, d] over the flattened input: the noise is "
        "N(0, sigma^2 C)",
        default_help="",
        metavar="FILE.npy",
        check=_array,
    )
    noise_scale: str = option(
        "absolute",
        help="absolute, or std: sigma times each coordinate's standard deviation over the whole data set (for "
        "tables: sigma in units of each feature's spread; Gaussian, diagonal)",
        choices=NOISE_SCALES,
    )


@dataclass(frozen=True, kw_only=True)
class SeedOptions:
    """The seed of every random stream (recorded, part of a folder's identity)."""

    TITLE: ClassVar[str] = "random streams"

    seed: int = option(
        0,
        help="seed of every random stream (each point's stream depends on it and the point's index)",
        metavar="S",
        parse=int,
        check=_integer(None, False),
        record="seed",
        implied=0,
        param="seed",
    )


@dataclass(frozen=True, kw_only=True)
class EstimatorOptions(SeedOptions):
    """What the estimators compute: recorded in ``config.json`` and part of a folder's identity.
    ``param`` names the estimator's argument each sets (see :func:`estimator_parameters`)."""

    TITLE: ClassVar[str] = "estimators"

    target: str = option(
        "prediction",
        help="class whose survival is measured: prediction (the clean prediction, the paper's definition; "
        "a point whose clean prediction is tied stops the run before any estimate) or label (the true class)",
        choices=TARGETS,
        record="target",
    )
    temperature: float = option(
        1.0,
        help="softmax temperature of method softmax",
        metavar="T",
        check=_positive,
        record="temperature",
        param="temperature",
    )
    tol: float = option(
        DEFAULT_TOL,
        help=f"absolute error tolerance of the mvn-cdf ({_with('tol')})",
        metavar="TOL",
        check=_positive,
        record="tol",
        param="tol",
    )
    confidence: float = option(
        DEFAULT_CONFIDENCE,
        help=f"level of the Monte Carlo confidence interval ({_with('confidence')})",
        metavar="LEVEL",
        check=_level,
        record="confidence",
        param="confidence",
    )
    interval: str = option(
        "wilson",
        help="Monte Carlo interval of method mc (mc_cv and mc_is give their own)",
        choices=INTERVALS,
        record="interval",
        param="interval",
    )
    sampling: str = option(
        "centred",
        help="MMSE noise draws: centred or iid (see probust.MMSE)",
        choices=MMSE_SAMPLINGS,
        record="sampling",
        param="sampling",
    )
    p_fail: bool = option(
        False,
        help=f"also compute p_fail = 1 - p directly, with relative accuracy, for {_with('p_fail')} "
        "(columns p_fail, p_fail_error; up to C-1 extra mvn integrals per point for the mvn-cdf methods; "
        "mc_is always fills them)",
        check=_bool,
        record="p_fail",
        implied=False,
        param="p_fail",
    )
    target_half_width: float | None = option(
        None,
        help=f"adaptive Monte Carlo ({_with('target_half_width')}): stop a point once its interval's half-width "
        "is at most W, checked every 1,000 draws for mc, 500 for mc_cv (column n_drawn: the draws used)",
        default_help="always --mc-samples draws",
        metavar="W",
        check=_half_width,
        record="target_half_width",
        implied=None,
        param="target_half_width",
    )
    prune: str = option(
        "auto",
        help=f"{_with('prune')}: leave out the decision boundaries that cannot matter (what they could cost is "
        "added to cdf_error; column boundaries_kept): auto (where it applies and a route other than every "
        "gradient by its own pass pays by counts, from about 81 classes or fewer than a linear head's features + "
        "1, or --gradients names one: leave out those whose tails fit the budget; a screening bounds every "
        "boundary's distance, by 8 reverse-mode probes or 8 to 32 forward-mode ones, then only those still within "
        "reach get exact gradients), spectral or sketch (that screening on every point), or off (every boundary "
        "kept)",
        choices=PRUNE_CHOICES,
        record="prune",
        implied="auto",
        param="prune",
    )
    check_draws: int | None = option(
        None,
        help=f"noise draws per point on which {_with('check_draws')} check their linearisation against the "
        "model (columns agreement, agreement_draws; one forward pass each): at most M fresh draws, 8 on every "
        "point and the rest where those leave the verdict open; 0: no check",
        default_help="Taylor: up to 32 fresh draws; MMSE: its own noisy copies",
        metavar="M",
        parse=int,
        check=_integer(0, True),
        record="check_draws",
        implied=None,
        param="check_draws",
    )
    gradients: str = option(
        "auto",
        help=f"where {_with('gradients')} take the exact margin gradients from (column route): auto (each "
        "point's cheapest, by counts), direct (one backward pass per boundary, the paper's computation), head "
        "(through the model's linear head, where its features are fewer than the classes), or forward "
        "(forward mode, for inputs with few coordinates); a forced one runs no screening",
        choices=GRADIENTS,
        record="gradients",
        implied="auto",
        param="gradients",
    )


@dataclass(frozen=True, kw_only=True)
class ComputeOptions:
    """How the work runs: none of these changes a number, so none is part of a folder's identity.
    With ``batch_size``, ``channels_last`` (and ``probust estimate``'s ``jacobian``) fixed, the
    execution plan is fixed too, for tables identical to the bit on any machine."""

    TITLE: ClassVar[str] = "how it runs"

    device: str | torch.device = option(
        "auto",
        help="cpu, cuda, cuda:N or auto (cuda if available); under torchrun on GPUs each rank uses cuda:LOCAL_RANK",
        check=_device,
    )
    unit_size: int = option(
        256,
        help="points per work unit: per estimator call and per part file",
        metavar="B",
        parse=int,
        check=_integer(1, False),
    )
    batch_size: int | None = option(
        None,
        help="most inputs per pass through the model inside the estimators (noisy copies, or pulled rows)",
        default_help="each estimator's own, measured per model",
        metavar="R",
        parse=int,
        check=_integer(1, True),
        param="batch_size",
    )
    memory_budget: int | str | None = option(
        None,
        help="bytes (or a size such as 4GB) each estimator may hold at once; row and class chunks are chosen to fit",
        default_help="half the memory free on the device",
        metavar="SIZE",
        check=_budget,
        param="memory_budget",
    )
    channels_last: bool | None = option(
        None,
        help="channels_last memory format for convolutional models: measured (auto), on or off",
        choices={"auto": None, "on": True, "off": False},
        check=_channels_last,
        param="channels_last",
    )
    show_progress: bool = option(True, help="no progress bars or summary (errors only)", flag="--quiet", check=_bool)


@dataclass(frozen=True, kw_only=True)
class ExecutionOptions(ComputeOptions):
    """How ``probust estimate``'s estimators run (never changes a number)."""

    jacobian: str = option(
        "auto",
        help="how the analytic methods run their backward passes: measured once per model (auto), one per "
        "class (loop), or torch.func vmap (speed and rounding only; where the gradients come from is --gradients)",
        choices=JACOBIANS,
        param="jacobian",
    )


@dataclass(frozen=True, kw_only=True)
class FolderOptions:
    """The results folder (see :mod:`probust.run.store` and :mod:`probust.run.folder`)."""

    TITLE: ClassVar[str] = "input and output"

    out: str | os.PathLike = option(
        "results",
        help="the results folder (created); holds config.json and Parquet files",
        metavar="DIR",
        check=_path(False),
    )
    overwrite: bool = option(False, help="replace the results of a different run in --out", check=_bool)
    extend: bool = option(
        False,
        help="add points, sigmas, methods or sample counts to a folder holding results of the same data, model "
        "and settings",
        check=_bool,
    )
    merge: bool = option(
        True,
        help="keep one Parquet file per work unit instead of merging them into results.parquet at the end",
        flag="--no-merge",
        check=_bool,
    )
    allow_version_change: bool = option(
        False,
        help="resume or extend --out although another probust version wrote its rows (refused by default: "
        "the rows of two versions could differ; recorded in config.json's history). A folder in another "
        "results format is always refused",
        check=_bool,
    )


#: The groups :class:`RunSettings` composes, in the order they are checked and listed.
GROUPS: tuple[type, ...] = (DataOptions, NoiseOptions, EstimatorOptions, ExecutionOptions, FolderOptions)


@dataclass(frozen=True, kw_only=True)
class RunSettings(FolderOptions, ExecutionOptions, EstimatorOptions, NoiseOptions, DataOptions):
    """Every argument of a run, checked and normalised when the object is built.

    The fields are those of :data:`GROUPS` (each documented by its declaration; ``probust estimate
    --help`` shows them all). Sequences are stored as sorted tuples (``sigmas``, ``mc_samples``,
    ``mmse_samples``, ``indices``; ``methods`` in ``probust.METHODS`` order), numbers as int or float,
    ``model_args`` as a dict.

    Raises:
        ConfigError: a bad value; its ``field`` names the argument, and the message is one line.
    """

    def __post_init__(self) -> None:
        check_declared(self)
        takes = {option for m in self.methods for option in REGISTRY[m].run_options}
        if "gradients" in takes:
            try:  # the estimators' own check, before any work (the run names these settings alike)
                check_settings(
                    self.prune if "prune" in takes else "auto",  # as the methods that take it get it
                    self.gradients,
                    p_fail=self.p_fail,
                    gaussian=self.noise == "gaussian",
                    jacobian=self.jacobian,
                )
            except OptionError as exc:
                raise ConfigError(*exc.parts, field=exc.field) from None
        gaussian = [m for m in self.methods if REGISTRY[m].needs_gaussian]
        check_noise(self.noise, self.noise_std, self.noise_cov, self.noise_scale, gaussian)
        if self.target == "label" and getattr(self.data, "labelled", True) is False:
            raise ConfigError(
                "'label' needs the points' labels and the data came without them: give (x, y), or measure the "
                "clean prediction with ",
                Setting("target", "prediction"),
                field="target",
            )

    def replace(self, **changes: Any) -> RunSettings:
        """A copy with some arguments changed (checked again)."""
        return dataclasses.replace(self, **changes)


def check_keywords(
    given: Iterable[str],
    *,
    settings: type | None = None,
    function: str = "run_estimate",
    others: Iterable[str] = (),
    without: Iterable[str] = (),
) -> None:
    """Refuse keyword arguments that are neither options of ``settings`` (default
    :class:`RunSettings`) nor ``others`` (or are in ``without``), where the dataclass would raise
    a bare TypeError.

    The message names the keyword, the closest valid one (difflib) or the option a command-line
    flag of that name sets (``quiet`` -> ``show_progress=False``), and every valid keyword.

    Raises:
        ConfigError: ``field`` is the unknown keyword.
    """
    cls = RunSettings if settings is None else settings
    valid = sorted(({f.name for f in dataclasses.fields(cls)} | set(others)) - set(without))
    unknown = [k for k in given if k not in valid]
    if not unknown:
        return
    name = unknown[0]
    hint: tuple[Any, ...] = ()
    flag = _flag_options(cls).get(name)
    if flag is not None:
        hint = (" (did you mean ", flag, f", the command line's --{name.replace('_', '-')}?)")
    else:
        close = difflib.get_close_matches(name, valid, n=1, cutoff=0.6)
        if close:
            hint = (" (did you mean ", Setting(close[0]), "?)")
    raise ConfigError(f"not an argument of {function}", *hint, f"; its arguments: {', '.join(valid)}", field=name)


def _flag_options(cls: type) -> dict[str, Setting]:
    """A command-line flag's words (``quiet`` for ``--quiet``) -> the option it sets from Python,
    where the two are named differently (``show_progress=False``, ``sigmas``)."""
    out: dict[str, Setting] = {}
    for f, o in declared(cls):
        for flag in (o.flag or "", *o.aliases):
            word = flag.lstrip("-").replace("-", "_")
            if not word or word == f.name:
                continue
            # A switch whose flag turns the default True off (--quiet, --no-merge).
            out[word] = Setting(f.name, False) if f.default is True else Setting(f.name)
    return out


def check_declared(settings: Any) -> None:
    """Check and normalise, in place, every declared field of a frozen settings dataclass
    composed of :class:`SourceOptions` and :class:`FolderOptions` (a run's, a certification's),
    then what one field cannot check alone.

    Raises:
        ConfigError: a bad value; its ``field`` names the argument.
    """
    for f, o in declared(settings):
        value = getattr(settings, f.name)
        if o.check is not None:
            value = o.check(value, f.name)
        elif o.choices is not None:
            allowed = tuple(o.choices.values() if isinstance(o.choices, Mapping) else o.choices)
            _choice(allowed)(value, f.name)
        object.__setattr__(settings, f.name, value)
    if isinstance(settings.data, (str, os.PathLike)) and settings.split not in ("train", "test"):
        raise ConfigError(f"expected train or test, got {settings.split!r}", field="split")
    if settings.overwrite and settings.extend:
        raise ConfigError(Setting("overwrite", True), " and ", Setting("extend", True), " exclude each other")
    _check_normalization(settings)


def recorded(settings: Any, noise_description: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """What ``config.json``'s "run" records of the settings (with the data and the model, a
    folder's identity): every declared option with a ``record`` key; the noise as described
    (where the settings have a noise)."""
    out = {o.record: getattr(settings, f.name) for f, o in declared(settings) if o.record is not None}
    # As JSON reads them back (a folder's config is compared with a new run's).
    out = {key: list(value) if isinstance(value, tuple) else value for key, value in out.items()}
    if noise_description is not None:
        out["noise"] = dict(noise_description)
    out["model_args"] = dict(settings.model_args)
    return out


#: Settings added to ``config.json``'s "run" after the first format, with the value a folder
#: written before them implicitly has (compared as such, so such folders still resume). A folder
#: from before ``prune`` computed every boundary; it counts as "auto", which computes every
#: boundary below 1,000 classes for models without a narrow linear head (the same rows, bitwise)
#: and otherwise stays within ``tol``. Derived from the declarations (``implied``).
SETTING_DEFAULTS: dict[str, Any] = {
    o.record: o.implied for _, o in declared(RunSettings) if o.record is not None and o.implied is not UNSET
}


def estimator_parameters(settings: Any, run_options: Iterable[str]) -> dict[str, Any]:
    """The keyword arguments of a method's estimator that the run's settings (a
    :class:`RunSettings`, or another settings dataclass such as a certification's) give, under the
    estimator's names (each option's declared ``param``): those of :data:`RUN_OPTIONS` only when
    the method takes them (``run_options``), the others (seed, memory budget, ...) always; a None
    value (or a False ``p_fail``) leaves the estimator's default."""
    takes = set(run_options)
    out = {}
    # Another object holding a run's attributes (a namespace) reads as a RunSettings.
    for f, o in declared(settings if dataclasses.is_dataclass(settings) else RunSettings):
        if o.param is None or (o.param in RUN_OPTIONS and o.param not in takes):
            continue
        value = getattr(settings, f.name)
        if value is None or (o.param == "p_fail" and not value):
            continue
        out[o.param] = value
    return out
