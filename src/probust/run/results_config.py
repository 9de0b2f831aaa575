"""A results folder's ``config.json``, read typed: :class:`ResultsConfig`.

The runner writes ``config.json`` (see :mod:`probust.run.folder`); the experiments and the runner
read it back through :func:`read_results_config` rather than by raw keys. Every configuration
written by an earlier version still reads: a key it lacks takes the value that version implied
(:data:`SETTING_DEFAULTS` for the run settings added later), or None where nothing was implied.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from probust._options import UNSET, declared
from probust.run.reading import read_config
from probust.run.settings import SETTING_DEFAULTS, RunSettings
from probust.run.store import CONFIG_NAME, FORMAT

#: Each recorded option: its key, declared type and implied value (None where nothing was implied).
_RECORDED = [
    (o.record, str(f.type), None if o.implied is UNSET else o.implied)
    for f, o in declared(RunSettings)
    if o.record is not None
]

__all__ = [
    "SETTING_DEFAULTS",
    "DataInfo",
    "HistoryEntry",
    "ModelInfo",
    "RecordedSettings",
    "ResultsConfig",
    "is_results_folder",
    "read_results_config",
]


@dataclass(frozen=True)
class RecordedSettings:
    """The "run" section: the data, the model and the estimator settings the rows were computed
    with (a folder takes only rows of one such run). None: not recorded.

    Every recorded option (declared with a ``record`` key in :mod:`probust.run.settings`: seed,
    target, temperature, tol, confidence, interval, sampling, p_fail, target_half_width, prune,
    check_draws, gradients, noise, model_args) reads as an attribute of its key, typed as declared; a
    folder written before an option holds what it implied (:data:`SETTING_DEFAULTS`). ``noise``: its "kind"
    ("gaussian", "uniform", "laplace") and any shape (see :mod:`probust.run.noise_options`).
    """

    dataset: str | None
    split: str | None
    data_size: int | None
    data_sha256: str | None
    model_sha256: str | None
    values: Mapping[str, Any] = field(default_factory=dict)

    def __getattr__(self, name: str) -> Any:
        try:
            values = object.__getattribute__(self, "values")
        except AttributeError:
            raise AttributeError(name) from None
        if name in values:
            return values[name]
        raise AttributeError(f"{type(self).__name__} has no setting {name!r}")


@dataclass(frozen=True)
class ModelInfo:
    """The "model" section.

    Attributes:
        source: the model file's absolute path, or "nn.Module" for a module passed in Python.
        class_name: the module's ``module.qualname`` (modules passed in Python only).
        meta: the checkpoint's metadata (``probust.training.train`` writes dataset, arch, grad_reg,
            test_accuracy, extra_loss, extra_loss_config, ...); {} when there is none.
        sha256: of the model file, or of the module's state_dict.
    """

    source: str | None
    class_name: str | None
    meta: dict[str, Any]
    sha256: str | None

    @property
    def file(self) -> str | None:
        """The model file, or None for a module passed in Python (or none recorded)."""
        return self.source if self.source and self.source != "nn.Module" else None


@dataclass(frozen=True)
class DataInfo:
    """The "data" section: the input shape [C, H, W], the classes and where the data came from."""

    input_shape: tuple[int, ...] | None
    num_classes: int | None
    classes: tuple[str, ...]
    source: str | None


@dataclass(frozen=True)
class HistoryEntry:
    """One process that wrote into the folder (``finished`` is None while it runs, or if it died;
    ``allow_version_change``: it was allowed to add rows to a folder of another probust version)."""

    started: str | None
    finished: str | None
    probust_version: str | None
    torch_version: str | None
    device: str | None
    world_size: int | None
    host: str | None
    argv: tuple[str, ...] | None
    allow_version_change: bool = False


@dataclass(frozen=True)
class ResultsConfig:
    """A results folder's configuration, typed.

    Attributes:
        format: :data:`~probust.run.store.FORMAT` for a probust results folder.
        format_version: the version of that format (None: not recorded).
        probust_version, torch_version, created, device, world_size: of the run that created
            the folder (None: not recorded).
        settings: the "run" section (:class:`RecordedSettings`).
        requests: one JSON object per call that added rows (sigmas, methods, mc_samples,
            mmse_samples, n_points, indices as half-open ranges), as written.
        model: the "model" section (:class:`ModelInfo`).
        data: the "data" section (:class:`DataInfo`).
        history: every process that wrote into the folder, oldest first.
        raw: the JSON object as read (do not modify).
    """

    format: str | None
    format_version: int | None
    probust_version: str | None
    torch_version: str | None
    created: str | None
    device: str | None
    world_size: int | None
    settings: RecordedSettings
    requests: tuple[dict[str, Any], ...]
    model: ModelInfo
    data: DataInfo
    history: tuple[HistoryEntry, ...]
    raw: dict[str, Any] = field(repr=False, compare=False)

    @property
    def is_probust(self) -> bool:
        """Whether this is a probust results configuration (its format is :data:`FORMAT`)."""
        return self.format == FORMAT

    @property
    def run_values(self) -> dict[str, Any]:
        """The "run" section as written, with :data:`SETTING_DEFAULTS` for settings it predates
        (``probust estimate``'s folders only: the defaults are its settings')."""
        run = self.raw.get("run")
        implied = SETTING_DEFAULTS if self.is_probust else {}
        return {**implied, **(run if isinstance(run, dict) else {})}

    @property
    def dataset(self) -> str | None:
        """The name of the data set the rows were computed on."""
        return self.settings.dataset

    @property
    def split(self) -> str | None:
        return self.settings.split

    @property
    def seed(self) -> int:
        return self.settings.seed

    @property
    def classes(self) -> tuple[str, ...]:
        """The data set's class names (empty when not recorded)."""
        return self.data.classes

    @property
    def model_meta(self) -> dict[str, Any]:
        """A copy of the checkpoint's metadata ({} when there is none)."""
        return dict(self.model.meta)

    @classmethod
    def from_dict(cls, config: Any) -> ResultsConfig:
        """Read a parsed ``config.json``.

        Raises:
            ValueError: ``config`` is not a JSON object, or a recorded value has the wrong type
                (the message names its key).
        """
        if not isinstance(config, dict):
            raise ValueError(f"a results configuration is a JSON object, got {type(config).__name__}")
        run, model, data = (_section(config, name) for name in ("run", "model", "data"))
        history = config.get("history")
        requests = config.get("requests")
        return cls(
            format=_str(config, "format"),
            format_version=_int(config, "format_version"),
            probust_version=_str(config, "probust_version"),
            torch_version=_str(config, "torch_version"),
            created=_str(config, "created"),
            device=_str(config, "device"),
            world_size=_int(config, "world_size"),
            settings=RecordedSettings(
                dataset=_str(run, "dataset"),
                split=_str(run, "split", "test"),
                data_size=_int(run, "data_size"),
                data_sha256=_str(run, "data_sha256"),
                model_sha256=_str(run, "model_sha256"),
                values={key: _recorded(run, key, kind, implied) for key, kind, implied in _RECORDED},
            ),
            requests=tuple(r for r in requests if isinstance(r, dict)) if isinstance(requests, list) else (),
            model=ModelInfo(
                source=_str(model, "source"),
                class_name=_str(model, "class"),
                meta=dict(model["meta"]) if isinstance(model.get("meta"), dict) else {},
                sha256=_str(model, "sha256"),
            ),
            data=DataInfo(
                input_shape=_shape(data.get("input_shape")),
                num_classes=_int(data, "num_classes"),
                classes=tuple(str(c) for c in data["classes"]) if isinstance(data.get("classes"), list) else (),
                source=_str(data, "source"),
            ),
            history=tuple(_history(h) for h in history if isinstance(h, dict)) if isinstance(history, list) else (),
            raw=config,
        )


def read_results_config(path: str | os.PathLike) -> ResultsConfig | None:
    """The typed configuration of a results folder (``config.json``) or of a merged Parquet file.

    Returns:
        None when there is none.

    Raises:
        ValueError: it is not valid JSON, or not a configuration (see :meth:`ResultsConfig.from_dict`).
    """
    config = read_config(path)
    return None if config is None else ResultsConfig.from_dict(config)


def is_results_folder(path: str | os.PathLike, format: str = FORMAT) -> bool:
    """Whether ``path`` is a folder with a ``config.json`` of format ``format`` (default
    :data:`FORMAT`, ``probust estimate``'s; False for an unreadable or foreign one)."""
    config = Path(path) / CONFIG_NAME
    if not config.is_file():
        return False
    try:
        value = json.loads(config.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(value, dict) and value.get("format") == format


def _section(config: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    value = config.get(name)
    return value if isinstance(value, dict) else {}


def _str(section: Mapping[str, Any], key: str, default: str | None = None) -> str | None:
    value = section.get(key, default)
    return None if value is None else str(value)


def _number(section: Mapping[str, Any], key: str, default: Any, kind: type[int] | type[float]) -> Any:
    value = section.get(key, default)
    if value is None:
        return None
    expected = "an integer" if kind is int else "a number"
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"config.json: {key}: expected {expected}, got {value!r}")
    try:
        return kind(value)
    except ValueError:
        raise ValueError(f"config.json: {key}: expected {expected}, got {value!r}") from None


def _int(section: Mapping[str, Any], key: str, default: int | None = None) -> int | None:
    return _number(section, key, default, int)


def _float(section: Mapping[str, Any], key: str, default: float | None = None) -> float | None:
    return _number(section, key, default, float)


def _recorded(run: Mapping[str, Any], key: str, kind: str, implied: Any) -> Any:
    """A recorded option, read as its declared type (dicts, such as the noise, as dicts)."""
    value = run.get(key, implied)
    if isinstance(value, dict) or isinstance(implied, dict):
        return dict(value) if isinstance(value, dict) else dict(implied)
    if value is None:
        return None
    if kind.startswith("bool"):
        return bool(value)
    if kind.startswith("int"):
        return _int(run, key, implied)
    if kind.startswith("float"):
        return _float(run, key, implied)
    return _str(run, key, implied)


def _shape(value: Any) -> tuple[int, ...] | None:
    return tuple(int(s) for s in value) if isinstance(value, list) else None


def _history(entry: Mapping[str, Any]) -> HistoryEntry:
    argv = entry.get("argv")
    return HistoryEntry(
        started=_str(entry, "started"),
        finished=_str(entry, "finished"),
        probust_version=_str(entry, "probust_version"),
        torch_version=_str(entry, "torch_version"),
        device=_str(entry, "device"),
        world_size=_int(entry, "world_size"),
        host=_str(entry, "host"),
        argv=tuple(str(a) for a in argv) if isinstance(argv, list) else None,
        allow_version_change=entry.get("allow_version_change") is True,
    )
