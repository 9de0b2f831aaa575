"""The checks of the runner's options: ``check(value, name)`` returns the normalised value, or
raises a :class:`~probust.run.ConfigError` whose ``field`` is ``name`` (declared beside each
option in :mod:`probust.run.settings` and :mod:`probust.run.data_options`)."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import torch
from torch import nn

from probust.errors import OptionError, Setting
from probust.estimators import (
    METHODS,
    REGISTRY,
)
from probust.execution import check_budget
from probust.run.errors import ConfigError
from probust.run.indices import parse_indices
from probust.run.sources import as_dataset, device_type

TARGETS = ("prediction", "label")


def path(optional: bool, what: str = "a folder") -> Any:
    def check(value: Any, name: str) -> Any:
        if value is None and optional:
            return None
        if not isinstance(value, (str, os.PathLike)):
            raise ConfigError(f"expected {what} (a str or a path), got {value!r}", field=name)
        return value

    return check


def boolean(value: Any, name: str) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ConfigError(f"must be True or False, got {value!r}", field=name)
    return bool(value)


def choice(allowed: Sequence[str]) -> Any:
    def check(value: Any, name: str) -> Any:
        if not isinstance(value, str) or value not in allowed:
            raise ConfigError(f"expected one of {', '.join(allowed)}, got {value!r}", field=name)
        return value

    return check


def listed(values: Any, name: str, what: str) -> list[Any]:
    """A scalar as a one-item list, or the items of a list, tuple, array, ...; anything else is refused."""
    if isinstance(values, (torch.Tensor, np.ndarray)):
        values = values.tolist()
    if isinstance(values, (str, int, float, np.number)):
        return [values]
    if isinstance(values, (bytes, dict)) or not isinstance(values, Iterable):
        raise ConfigError(f"expected {what} or a list of them, got {values!r}", field=name)
    return list(values)


def number(value: Any, name: str, message: str = "") -> float:
    """``value`` as a float: a number (not a bool) or a string holding one (as the CLI gives)."""
    bad = message or f"{value!r} is not a number"
    if isinstance(value, (bool, np.bool_)) or not isinstance(value, (int, float, str, np.number)):
        raise ConfigError(bad, field=name)
    try:
        return float(value)
    except (TypeError, ValueError, OverflowError):
        raise ConfigError(bad, field=name) from None


def positive(value: Any, name: str) -> float:
    v = number(value, name)
    if not np.isfinite(v) or v <= 0:
        raise ConfigError(f"must be a positive number, got {value}", field=name)
    return v


def integer(minimum: int | None, optional: bool) -> Any:
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


def sigmas(sigmas: Any, name: str) -> tuple[float, ...]:
    values = listed(sigmas, name, "a noise level")
    if not values:
        raise ConfigError("give at least one noise level", field=name)
    out = []
    for v in values:
        s = number(v, name, f"{v!r} is not a number")
        if not np.isfinite(s) or s <= 0:
            raise ConfigError(f"noise levels must be positive finite numbers, got {v}", field=name)
        out.append(s)
    return tuple(sorted(set(out)))


def methods(methods: Any, name: str) -> tuple[str, ...]:
    values = listed(methods, name, "a method name")
    if not values:
        raise ConfigError("give at least one method", field=name)
    unknown = [m for m in values if not isinstance(m, str) or m not in METHODS]
    if unknown:
        raise ConfigError(f"unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}", field=name)
    return tuple(m for m in METHODS if m in values)


def counts(values: Any, name: str) -> tuple[int, ...]:
    items = listed(values, name, "a sample count")
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


def split(value: Any, name: str) -> str:
    if not isinstance(value, str):
        raise ConfigError(f"expected train or test, got {value!r}", field=name)
    return value


def indices(value: Any, name: str) -> tuple[int, ...] | None:
    return None if value is None else tuple(int(i) for i in parse_indices(value))


def data(data: Any, name: str) -> Any:
    if isinstance(data, (str, os.PathLike)):
        return data
    # A DataLoader's data set (checked to be read as the loader reads it), tensors as a data set.
    data = as_dataset(data)
    if not hasattr(data, "__getitem__") or not hasattr(data, "__len__") or isinstance(data, bytes):
        raise ConfigError(
            f"expected a data set name or a Dataset with ds[i] -> (x, label) and len(ds), got {data!r}", field=name
        )
    return data


def model(model: Any, name: str) -> Any:
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


def model_args(value: Any, name: str) -> dict[str, Any]:
    """A dict of keyword arguments (or ``KEY=VALUE`` strings / pairs) whose values JSON can record."""
    if value is None:
        return {}
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, Mapping):
        pairs = []
        for item in listed(value, name, "KEY=VALUE"):
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


def device(value: Any, name: str) -> Any:
    if not isinstance(value, (str, torch.device)):
        raise ConfigError(f"expected cpu, cuda, cuda:N or auto, got {value!r}", field=name)
    device_type(value)
    return value


def budget(value: Any, name: str) -> Any:
    try:
        check_budget(value)
    except OptionError as exc:
        raise ConfigError(*exc.parts, field=name) from None
    return value


def channels_last(value: Any, name: str) -> bool | None:
    if value is not None and not isinstance(value, bool):
        raise ConfigError(f"expected True, False or None (measured), got {value!r}", field=name)
    return value


def level(value: Any, name: str) -> float:
    level = number(value, name)
    if not 0 < level < 1:
        raise ConfigError(f"must be in (0, 1), got {level}", field=name)
    return level


def half_width(value: Any, name: str) -> float | None:
    if value is None:
        return None
    width = positive(value, name)
    if width >= 0.5:
        raise ConfigError(f"must be below 0.5 (a half-width of a probability), got {width}", field=name)
    return width


def mapping(what: str) -> Any:
    def check(value: Any, name: str) -> Any:
        if value is not None and not isinstance(value, Mapping):
            raise ConfigError(f"expected {what}, got {value!r}", field=name)
        return value

    return check


def array(value: Any, name: str) -> Any:
    if value is not None and not isinstance(value, (str, os.PathLike, np.ndarray, torch.Tensor, list, tuple)):
        raise ConfigError(f"expected a .npy file or an array, got {value!r}", field=name)
    return value


def statistics(positive: bool) -> Any:
    """A normalisation statistic (``mean``, ``std``): None, or finite numbers (``std``: positive)
    as a tuple of floats, one per channel or one for all."""

    def check(value: Any, name: str) -> tuple[float, ...] | None:
        if value is None:
            return None
        items = listed(value, name, "a number")
        if not items:
            raise ConfigError("give one value per channel, or one for all", field=name)
        out = []
        for item in items:
            v = number(item, name)
            if not np.isfinite(v) or (positive and v <= 0):
                raise ConfigError(f"must be {'positive' if positive else 'finite'} numbers, got {item}", field=name)
            out.append(v)
        return tuple(out)

    return check


def check_normalization(settings: Any) -> None:
    """``mean`` and ``std`` have the same length, or one of them has one value."""
    mean, std = getattr(settings, "mean", None), getattr(settings, "std", None)
    if mean is not None and std is not None and len(mean) != len(std) and 1 not in (len(mean), len(std)):
        raise ConfigError(
            f"has {len(std)} values and ", Setting("mean"), f" {len(mean)}: give one per channel to both", field="std"
        )


def named(methods: Iterable[str]) -> str:
    return ", ".join(methods)


def with_option(run_option: str) -> str:
    return named(name for name, spec in REGISTRY.items() if run_option in spec.run_options)


def sampled(kind: str) -> str:
    return named(name for name, spec in REGISTRY.items() if spec.samples == kind)


__all__ = [
    "TARGETS",
    "array",
    "boolean",
    "budget",
    "channels_last",
    "check_normalization",
    "choice",
    "counts",
    "data",
    "device",
    "half_width",
    "indices",
    "integer",
    "listed",
    "level",
    "mapping",
    "methods",
    "model",
    "model_args",
    "model_argument",
    "named",
    "number",
    "path",
    "positive",
    "sampled",
    "sigmas",
    "split",
    "statistics",
    "with_option",
]
