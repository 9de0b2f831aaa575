"""Score a data set with several estimators and noise levels into a resumable results table.

The work is a grid: points x sigmas x (method, sample count). Points are cut into fixed blocks
of ``batch_size`` consecutive selected points; a *work unit* is one block for one (sigma,
method, sample count), computed by one estimator call and stored as one Parquet part (see
:mod:`probust.store`). A restarted run reads which rows exist and computes only the missing
units, with the same blocks, so its table equals an uninterrupted run's value for value. Under
torchrun the blocks are dealt out to the ranks (see :mod:`probust._distributed`).

Two steps, so that every bad argument is reported before any work starts::

    plan = probust.runner.prepare(data="fashion-mnist", model="cnn.pt", sigmas=[0.1],
                                  methods=["mc", "softmax"], out="results/")   # may raise ConfigError
    summary = probust.runner.execute(plan)

or both at once, returning the table: ``df = probust.run_estimate(...)``.
"""

from __future__ import annotations

import datetime as _dt
import hashlib
import os
import platform
import re
import sys
import time
import warnings
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from probust import _distributed
from probust._budget import check_budget
from probust._checks import eval_mode
from probust._json import jsonable
from probust._stats import INTERVALS
from probust._tuning import JACOBIANS, sync
from probust.estimators import MMSE
from probust.estimators import METHODS, make_estimator
from probust.store import OPTIONAL_COLUMNS, ResultStore, read_results

__all__ = [
    "DEFAULT_METHODS",
    "ConfigError",
    "ConfigMismatchError",
    "RunPlan",
    "RunSummary",
    "Task",
    "execute",
    "hash_state_dict",
    "parse_indices",
    "prepare",
    "run_estimate",
]

#: The paper's six methods: what a run computes unless told otherwise (the Monte Carlo
#: variants "mc_cv" and "mc_is" cost as much as "mc" each, so they are asked for by name).
DEFAULT_METHODS = tuple(m for m in ("mc", "taylor", "mmse", "taylor_mvs", "mmse_mvs", "softmax") if m in METHODS)
TARGETS = ("prediction", "label")
MMSE_SAMPLINGS = MMSE.SAMPLINGS
_FORMAT = "probust.results"
_FORMAT_VERSION = 1
#: Settings added to ``config.json``'s "run" after the first format, with the value a folder
#: written before them implicitly has (compared as such, so such folders still resume).
_SETTING_DEFAULTS: dict[str, Any] = {"p_fail": False, "mc_half_width": None}
#: The Monte Carlo methods that stop a point early in an adaptive run (``mc_half_width``).
ADAPTIVE_METHODS = ("mc", "mc_cv")
#: The analytic methods that compute ``p_fail`` on request (``p_fail=True``, ``--p-fail``).
P_FAIL_METHODS = ("taylor", "mmse", "taylor_mvs", "mmse_mvs")
#: The Monte Carlo methods around an MMSE linearisation: its copies are the smallest ``mmse_samples``.
LINEARISED_MC_METHODS = ("mc_cv", "mc_is")
#: The copies those methods used before the runner passed ``mmse_samples`` on (MonteCarloCV's
#: default), implied by a folder's request that recorded no ``mmse_samples`` for them.
_LEGACY_LINEARISATION_SAMPLES = 5


class ConfigError(ValueError):
    """A bad argument, found before any work started (the CLI prints it on one line, exit 2)."""


class ConfigMismatchError(ConfigError):
    """The output folder holds results of a different run.

    Attributes:
        differences: one ``"field: value there, value here"`` string per differing field.
    """

    def __init__(self, message: str, differences: Sequence[str] = ()) -> None:
        super().__init__(message)
        self.differences = list(differences)


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
    """A validated run, ready for :func:`execute` (built by :func:`prepare`).

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
    """

    store: ResultStore
    dataset: Any
    model: nn.Module
    device: torch.device
    indices: np.ndarray
    tasks: list[Task]
    config: dict[str, Any]
    world: _distributed.World
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
    linearisation_samples: int = 5
    warnings: list[str] = field(default_factory=list)

    def blocks(self) -> list[np.ndarray]:
        """The selected indices cut into consecutive blocks of ``batch_size``."""
        return [self.indices[i : i + self.batch_size] for i in range(0, len(self.indices), self.batch_size)]


@dataclass
class RunSummary:
    """What :func:`execute` did.

    Attributes:
        path: the results folder.
        rows_computed: rows this process computed now.
        rows_present: rows of this run's grid that were already stored when it started (all ranks).
        rows_total: rows of this run's grid.
        seconds: wall time of :func:`execute`.
        merged: the merged ``results.parquet``, or None when the parts were kept.
    """

    path: Path
    rows_computed: int
    rows_present: int
    rows_total: int
    seconds: float
    merged: Path | None


# -- argument parsing and checks -----------------------------------------------------------------

_RANGE = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?$")


def parse_indices(spec: str | int | Iterable[str | int]) -> np.ndarray:
    """Point indices from a list of numbers and inclusive ranges.

    Args:
        spec: ints, or strings like ``"7"``, ``"0-99"`` (100 points), ``"0-999:10"`` (every
            10th), possibly comma-separated (``"0-9,20,30-39"``).

    Returns:
        int64 [P], sorted and without duplicates.

    Raises:
        ConfigError: a malformed item or a descending range.
    """
    items = [spec] if isinstance(spec, (str, int)) else list(spec)
    parts: list[np.ndarray] = []
    for item in items:
        if isinstance(item, (int, np.integer)) and not isinstance(item, bool):
            if item < 0:
                raise ConfigError(f"indices: indices must be >= 0, got {item}")
            parts.append(np.array([item], dtype=np.int64))
            continue
        for token in str(item).replace(",", " ").split():
            m = _RANGE.match(token)
            if m is None:
                raise ConfigError(f"indices: cannot read {token!r}; expected N, A-B (inclusive) or A-B:STEP")
            start = int(m.group(1))
            stop = int(m.group(2)) if m.group(2) is not None else start
            step = int(m.group(3)) if m.group(3) is not None else 1
            if stop < start or step < 1:
                raise ConfigError(f"indices: {token!r} is an empty range (need A <= B and STEP >= 1)")
            parts.append(np.arange(start, stop + 1, step, dtype=np.int64))
    if not parts:
        raise ConfigError("indices: no indices given")
    return np.unique(np.concatenate(parts))


def _runs(indices: np.ndarray) -> list[slice]:
    """Slices of ``indices`` (sorted) over which the values are consecutive integers."""
    breaks = np.flatnonzero(np.diff(indices) != 1) + 1
    edges = [0, *breaks.tolist(), len(indices)]
    return [slice(a, b) for a, b in zip(edges[:-1], edges[1:], strict=True)]


def _ranges(indices: np.ndarray) -> list[list[int]]:
    """Sorted indices as half-open ranges [[start, stop], ...] (compact in config.json)."""
    if len(indices) == 0:
        return []
    return [[int(indices[r.start]), int(indices[r.stop - 1]) + 1] for r in _runs(indices)]


def _check_sigmas(sigmas: float | Iterable[float]) -> list[float]:
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
    return sorted(set(out))


def _check_methods(methods: str | Iterable[str]) -> list[str]:
    values = [methods] if isinstance(methods, str) else list(methods)
    if not values:
        raise ConfigError("methods: give at least one method")
    unknown = [m for m in values if m not in METHODS]
    if unknown:
        raise ConfigError(f"methods: unknown method {unknown[0]!r}; choose from {', '.join(METHODS)}")
    return [m for m in METHODS if m in values]


def _check_counts(values: int | Iterable[int], name: str) -> list[int]:
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
    return sorted(set(out))


def _check_positive(value: float, name: str) -> float:
    try:
        v = float(value)
    except (TypeError, ValueError):
        raise ConfigError(f"{name}: {value!r} is not a number") from None
    if not np.isfinite(v) or v <= 0:
        raise ConfigError(f"{name}: must be a positive number, got {value}")
    return v


def _check_int(value: int | None, name: str, minimum: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise ConfigError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _device_type(device: str | torch.device) -> str:
    """The device type the run will use ("auto" resolved), checked to exist on this machine."""
    if str(device) == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        dev = torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"device: unknown device {device!r}; expected cpu, cuda, cuda:N or auto") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(
            "device: cuda was asked for but no CUDA GPU is available here (use device='cpu' or device='auto')"
        )
    if dev.type == "mps" and not torch.backends.mps.is_available():
        raise ConfigError("device: mps was asked for but is not available here")
    return dev.type


def _resolve_device(device: str | torch.device, device_type: str, world: _distributed.World) -> torch.device:
    if device_type != "cuda":
        return torch.device(device_type)
    dev = torch.device("cuda") if str(device) == "auto" else torch.device(device)
    if dev.index is None:
        dev = torch.device("cuda", world.local_rank if world.distributed else torch.cuda.current_device())
    if dev.index >= torch.cuda.device_count():
        raise ConfigError(f"device: {dev} does not exist here ({torch.cuda.device_count()} GPUs)")
    torch.cuda.set_device(dev)  # so that code allocating on "cuda" without an index uses this rank's GPU
    return dev


# -- data and model ------------------------------------------------------------------------------


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def _load_data(data: Any, split: str, root: str | os.PathLike | None, download: bool) -> Any:
    if not isinstance(data, (str, os.PathLike)):
        if not hasattr(data, "__getitem__") or not hasattr(data, "__len__"):
            raise ConfigError(
                f"data must be a data set name or a Dataset with ds[i] -> (x, label), got {type(data).__name__}"
            )
        if len(data) == 0:
            raise ConfigError("data: the data set is empty")
        return data
    from probust import data as pdata

    try:
        return pdata.load(str(data), split, root=root, download=download)
    except (pdata.ProbustDataError, FileNotFoundError) as exc:
        lines = str(exc).strip().splitlines()
        hint = next((line for line in lines if line.startswith("to get it")), "")
        raise ConfigError(f"data: {lines[0] if lines else exc}" + (f" ({hint})" if hint else "")) from None
    except ValueError as exc:
        raise ConfigError(f"data: {_first_line(exc)}") from None


def _data_name(ds: Any) -> str:
    return str(getattr(ds, "name", None) or type(ds).__name__)


def _data_split(ds: Any, split: str) -> str:
    return str(getattr(ds, "split", None) or split)


def _batch(ds: Any, indices: np.ndarray) -> tuple[Tensor, Tensor]:
    """Points ``indices`` of ``ds``: (x float32 [B, *S], labels int64 [B])."""
    if hasattr(ds, "subset") and hasattr(ds, "tensors"):
        return ds.subset(torch.from_numpy(indices)).tensors()
    # A generic torch Dataset can only be read item by item.
    items = [ds[int(i)] for i in indices]
    x = torch.stack([torch.as_tensor(item[0]) for item in items]).to(torch.float32)
    y = torch.as_tensor([int(item[1]) for item in items], dtype=torch.int64)
    return x, y


def _input_shape(ds: Any) -> tuple[int, ...]:
    shape = getattr(ds, "input_shape", None)
    if shape is None:
        shape = tuple(torch.as_tensor(ds[0][0]).shape)
    return tuple(int(s) for s in shape)


def _num_classes(ds: Any) -> int | None:
    n = getattr(ds, "num_classes", None)
    if n is None and getattr(ds, "classes", None) is not None:
        n = len(ds.classes)
    return None if n is None else int(n)


def _hash_data(ds: Any, chunk: int = 4096) -> str:
    """sha256 over every point's float32 values and label (so a changed file is noticed)."""
    h = hashlib.sha256()
    for first in range(0, len(ds), chunk):
        x, y = _batch(ds, np.arange(first, min(first + chunk, len(ds)), dtype=np.int64))
        h.update(x.contiguous().numpy().tobytes())
        h.update(y.numpy().astype("<i8").tobytes())
    return h.hexdigest()


def _hash_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def hash_state_dict(model: nn.Module) -> str:
    """sha256 over a module's state_dict: names, dtypes, shapes and raw bytes, in name order."""
    h = hashlib.sha256()
    for name, tensor in sorted(model.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def _jsonable(value: Any) -> Any:
    """JSON types for config.json; an object JSON cannot hold is written as its str()."""
    return jsonable(value, lambda v: v if isinstance(v, (str, int, float, bool)) or v is None else str(v))


def _load_model(
    model: Any, device: torch.device, ds: Any, allow_pickle: bool
) -> tuple[nn.Module, dict[str, Any], list[str]]:
    """The model on ``device``, a JSON description (with its sha256), and warnings."""
    shape, classes, notes = _input_shape(ds), _num_classes(ds), []
    if isinstance(model, nn.Module):
        info = {
            "source": "nn.Module",
            "class": f"{type(model).__module__}.{type(model).__qualname__}",
            "meta": _jsonable(getattr(model, "probust_spec", {}) or {}),
            "sha256": hash_state_dict(model),
        }
        module = model.to(device)
    elif isinstance(model, (str, os.PathLike)):
        path = Path(model)
        if not path.is_file():
            raise ConfigError(f"model: no model file at {path}")
        from probust import models as pmodels

        try:
            module, meta = pmodels.load_model(
                path,
                map_location=device,
                expect_num_classes=classes,
                expect_input_shape=shape,
                allow_pickle=allow_pickle,
            )
        except pmodels.CheckpointMismatchError as exc:
            raise ConfigError(
                f"model: {_first_line(exc)} (data set {_data_name(ds)}: input shape {list(shape)}, {classes} classes)"
            ) from None
        except (pmodels.CheckpointError, OSError) as exc:
            raise ConfigError(f"model: {_first_line(exc)}") from None
        trained_on = meta.get("dataset")
        if trained_on is not None and hasattr(ds, "name"):
            from probust.data import canonical_name

            try:
                same = canonical_name(str(trained_on)) == canonical_name(str(ds.name))
            except ValueError:
                same = str(trained_on) == str(ds.name)
            if not same:
                notes.append(f"the model was trained on {trained_on}, it is scored on {ds.name}")
        info = {"source": str(path.resolve()), "meta": _jsonable(meta), "sha256": _hash_file(path)}
    else:
        raise ConfigError(f"model must be a path to a model file or a torch.nn.Module, got {type(model).__name__}")
    _probe(module, ds, device, shape, classes)
    return module, info, notes


def _probe(model: nn.Module, ds: Any, device: torch.device, shape: tuple[int, ...], classes: int | None) -> None:
    """Run two real points through the model: it must give logits [2, num_classes]."""
    x, _ = _batch(ds, np.arange(min(2, len(ds)), dtype=np.int64))
    try:
        with eval_mode(model), torch.no_grad():
            out = model(x.to(device))
    except Exception as exc:
        raise ConfigError(
            f"model: does not accept inputs of shape {list(shape)} from {_data_name(ds)} "
            f"({type(exc).__name__}: {_first_line(exc)})"
        ) from None
    if not isinstance(out, Tensor) or out.ndim != 2 or out.shape[0] != x.shape[0]:
        desc = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise ConfigError(f"model: returns {desc} for a batch of {x.shape[0]}, expected logits [batch, classes]")
    if classes is not None and out.shape[1] != classes:
        raise ConfigError(f"model: has {out.shape[1]} classes, the data set {_data_name(ds)} has {classes}")


# -- configuration -------------------------------------------------------------------------------


def _now() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def _versions() -> dict[str, str]:
    from probust import __version__

    return {"probust_version": __version__, "torch_version": torch.__version__}


def _request(sigmas, methods, mc_samples, mmse_samples, indices) -> dict[str, Any]:
    # Sample counts a run's methods do not use are left out, so they cannot make two runs differ.
    return {
        "sigmas": sigmas,
        "methods": methods,
        "mc_samples": mc_samples if any(_sample_kind(m) == "mc" for m in methods) else [],
        "mmse_samples": mmse_samples if any(_uses_mmse_samples(m) for m in methods) else [],
        "n_points": int(len(indices)),
        "indices": _ranges(indices),
    }


def _show(value: Any, limit: int = 60) -> str:
    text = str(value)
    if re.fullmatch(r"[0-9a-f]{64}", text):  # a sha256: its start tells two apart
        return text[:12] + "..."
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _compare(old: dict[str, Any], new: dict[str, Any], extend: bool, path: Path) -> dict[str, Any] | None:
    """The config to write when ``new`` may go into a folder holding ``old``; None to keep old.

    Raises:
        ConfigMismatchError: naming what differs.
    """
    if old.get("format") != _FORMAT:
        raise ConfigMismatchError(
            f"{path}/config.json is not a probust results configuration; use overwrite=True to replace it"
        )
    # Everything under "run" must match: the data, the model and the settings of the estimators
    # (a setting newer than the folder's config counts as its default there).
    old_run = {**_SETTING_DEFAULTS, **old["run"]}
    keys = list(new["run"]) + [k for k in old_run if k not in new["run"]]
    diffs = [
        f"{k}: {_show(old_run.get(k))} there, {_show(new['run'].get(k))} here"
        for k in keys
        if old_run.get(k) != new["run"].get(k)
    ]
    if diffs:
        raise ConfigMismatchError(
            f"{path} holds results of a different run ({'; '.join(diffs)}); "
            "use overwrite=True to replace them, or another out folder",
            diffs,
        )
    request = new["requests"][0]
    old_requests = [_with_legacy_defaults(r) for r in old["requests"]]
    if request in old_requests:
        return None
    if extend:
        _check_linearisation(old_requests, request, path)
        return {**old, "requests": [*old["requests"], request]}
    last = old_requests[-1]
    diffs = [
        f"{k}: {_show(last.get(k))} there, {_show(request.get(k))} here"
        for k in request
        if last.get(k) != request.get(k)
    ]
    raise ConfigMismatchError(
        f"{path} holds results of a different run ({'; '.join(diffs)}); use extend=True to add these rows to it, "
        "overwrite=True to replace it, or another out folder",
        diffs,
    )


def _with_legacy_defaults(request: dict[str, Any]) -> dict[str, Any]:
    """A request as this version records it: mc_cv and mc_is imply their MMSE copies."""
    if not request.get("mmse_samples") and any(m in LINEARISED_MC_METHODS for m in request.get("methods", ())):
        return {**request, "mmse_samples": [_LEGACY_LINEARISATION_SAMPLES]}
    return request


def _linearisation_samples(request: dict[str, Any]) -> int | None:
    """The MMSE copies of a request's mc_cv and mc_is rows; None when it has neither."""
    if not any(m in LINEARISED_MC_METHODS for m in request["methods"]) or not request["mmse_samples"]:
        return None
    return min(request["mmse_samples"])


def _check_linearisation(old_requests: list[dict[str, Any]], request: dict[str, Any], path: Path) -> None:
    """Refuse an extension whose mc_cv/mc_is rows would be linearised with other MMSE copies
    than the folder's (the rows' key has no place for it: the table would mix both)."""
    here = _linearisation_samples(request)
    there = {n for n in map(_linearisation_samples, old_requests) if n is not None}
    if here is None or not there or there == {here}:
        return
    diff = f"mmse_samples (mc_cv/mc_is linearisation): {min(there)} there, {here} here"
    raise ConfigMismatchError(
        f"{path} holds mc_cv/mc_is rows linearised with {min(there)} MMSE copies, this run would use {here} "
        f"(the smallest mmse_samples); include {min(there)} as the smallest mmse_samples, or leave mc_cv and "
        "mc_is out of this extension",
        [diff],
    )


# -- preparation ---------------------------------------------------------------------------------


def _agree(world: _distributed.World, error: BaseException | None) -> None:
    """Raise on every rank if any rank failed (so no rank waits forever for the others)."""
    outcomes = world.all_gather(None if error is None else (type(error).__name__, str(error)))
    if error is not None:
        raise error
    for rank, outcome in enumerate(outcomes):
        if outcome is not None:
            kind, message = outcome
            known = {"ConfigMismatchError": ConfigMismatchError, "ConfigError": ConfigError}
            if kind in known:
                raise known[kind](message)
            raise RuntimeError(f"rank {rank} failed: {kind}: {message}")


def _new_config(ds: Any, split: str, model_info: dict, settings: dict, request: dict, dev, world) -> dict[str, Any]:
    return {
        "format": _FORMAT,
        "format_version": _FORMAT_VERSION,
        "run": {
            "dataset": _data_name(ds),
            "split": _data_split(ds, split),
            "data_size": len(ds),
            "data_sha256": _hash_data(ds),
            "model_sha256": model_info["sha256"],
            **settings,
        },
        "requests": [request],
        "model": model_info,
        "data": {
            "input_shape": list(_input_shape(ds)),
            "num_classes": _num_classes(ds),
            "classes": _jsonable(list(getattr(ds, "classes", []) or [])),
            "source": str(getattr(ds, "source", "")),
        },
        "created": _now(),
        **_versions(),
        "device": str(dev),
        "world_size": world.world_size,
        "history": [],
    }


def prepare(
    data: str | Any,
    model: str | os.PathLike | nn.Module,
    sigmas: float | Sequence[float],
    methods: str | Sequence[str] = DEFAULT_METHODS,
    out: str | os.PathLike = "results",
    *,
    split: str = "test",
    mc_samples: int | Sequence[int] = 10_000,
    mmse_samples: int | Sequence[int] = 5,
    limit: int | None = None,
    indices: str | Sequence[int | str] | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    batch_size: int = 256,
    eval_batch_size: int | None = None,
    memory_budget: int | str | None = None,
    jacobian: str = "auto",
    channels_last: bool | None = None,
    temperature: float = 1.0,
    target: str = "prediction",
    tol: float = 1e-4,
    ci_level: float = 0.95,
    interval: str = "wilson",
    mmse_sampling: str = "centred",
    p_fail: bool = False,
    mc_half_width: float | None = None,
    show_progress: bool = True,
    overwrite: bool = False,
    extend: bool = False,
    merge: bool = True,
    download: bool = False,
    data_root: str | os.PathLike | None = None,
    allow_pickle: bool = False,
    argv: Sequence[str] | None = None,
) -> RunPlan:
    """Check every argument, load the data and the model, and claim the output folder.

    Nothing is computed. Under torchrun this joins the process group; every rank must call it.
    The arguments are those of :func:`run_estimate`.

    Raises:
        ConfigError: a bad argument, a missing data set, a model that does not fit the data,
            an output folder that cannot be written; the message is one line naming it.
        ConfigMismatchError: the folder holds results of a different run.
    """
    sigmas_ = _check_sigmas(sigmas)
    methods_ = _check_methods(methods)
    mc_ = _check_counts(mc_samples, "mc_samples")
    mmse_ = _check_counts(mmse_samples, "mmse_samples")
    limit = _check_int(limit, "limit", 1)
    batch_size = _check_int(batch_size, "batch_size", 1)
    eval_batch_size = _check_int(eval_batch_size, "eval_batch_size", 1)
    try:
        check_budget(memory_budget)
    except ValueError as exc:
        raise ConfigError(f"memory_budget: {exc}") from None
    if channels_last is not None and not isinstance(channels_last, bool):
        raise ConfigError(f"channels_last: expected True, False or None (measured), got {channels_last!r}")
    if jacobian not in JACOBIANS:
        raise ConfigError(f"jacobian: expected one of {', '.join(JACOBIANS)}, got {jacobian!r}")
    if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)):
        raise ConfigError(f"seed: must be an integer, got {seed!r}")
    seed = int(seed)
    temperature = _check_positive(temperature, "temperature")
    tol = _check_positive(tol, "tol")
    ci_level = float(ci_level)
    if not 0 < ci_level < 1:
        raise ConfigError(f"ci_level: must be in (0, 1), got {ci_level}")
    for value, allowed, name in (
        (target, TARGETS, "target"),
        (interval, INTERVALS, "interval"),
        (mmse_sampling, MMSE_SAMPLINGS, "mmse_sampling"),
    ):
        if value not in allowed:
            raise ConfigError(f"{name}: expected one of {', '.join(allowed)}, got {value!r}")
    if not isinstance(p_fail, (bool, np.bool_)):
        raise ConfigError(f"p_fail: must be True or False, got {p_fail!r}")
    p_fail = bool(p_fail)
    if mc_half_width is not None:
        mc_half_width = _check_positive(mc_half_width, "mc_half_width")
        if mc_half_width >= 0.5:
            raise ConfigError(f"mc_half_width: must be below 0.5 (a half-width of a probability), got {mc_half_width}")
    if overwrite and extend:
        raise ConfigError("overwrite=True and extend=True exclude each other")
    selected = parse_indices(indices) if indices is not None else None
    device_type = _device_type(device)
    if split not in ("train", "test") and isinstance(data, (str, os.PathLike)):
        raise ConfigError(f"split: expected train or test, got {split!r}")
    if out is None:
        raise ConfigError("out: give an output folder")

    world = _distributed.join(device_type)
    store = ResultStore(out)
    try:
        plan = None
        error: BaseException | None = None
        try:
            dev = _resolve_device(device, device_type, world)
            ds = _load_data(data, split, data_root, download)
            if selected is None:
                selected = np.arange(len(ds) if limit is None else min(limit, len(ds)), dtype=np.int64)
            else:
                if selected[-1] >= len(ds):
                    raise ConfigError(
                        f"indices: index {int(selected[-1])} is out of range for {_data_name(ds)} "
                        f"{_data_split(ds, split)} ({len(ds)} points)"
                    )
                selected = selected[:limit] if limit is not None else selected
            module, model_info, notes = _load_model(model, dev, ds, allow_pickle)
            settings = {
                "seed": seed,
                "target": target,
                "temperature": temperature,
                "tol": tol,
                "ci_level": ci_level,
                "interval": interval,
                "mmse_sampling": mmse_sampling,
                "p_fail": p_fail,
                "mc_half_width": mc_half_width,
            }
            request = _request(sigmas_, methods_, mc_, mmse_, selected)
            config = _new_config(ds, split, model_info, settings, request, dev, world)
            if world.is_main:
                config = _claim_folder(store, config, overwrite, extend)
            plan = RunPlan(
                store=store,
                dataset=ds,
                model=module,
                device=dev,
                indices=selected,
                tasks=_tasks(sigmas_, methods_, mc_, mmse_),
                config=config,
                world=world,
                batch_size=batch_size,
                eval_batch_size=eval_batch_size,
                memory_budget=memory_budget,
                jacobian=jacobian,
                channels_last=channels_last,
                show_progress=show_progress and world.is_main,
                merge=merge,
                linearisation_samples=mmse_[0],
                warnings=notes,
                **settings,
            )
        except ConfigError as exc:
            error = exc
        _agree(world, error)
        assert plan is not None
        if world.is_main:
            try:
                _start_history(plan, overwrite, argv)
            except ConfigError as exc:
                error = exc
        # Also a barrier: no rank reads the folder before rank 0 has cleared and claimed it.
        _agree(world, error)
        return plan
    except BaseException:
        store.release_lock()
        world.close()
        raise


def _sample_kind(method: str) -> str | None:
    """Which sample counts a method takes: "mc" (Monte Carlo draws), "mmse" (copies) or None."""
    return "mc" if method.startswith("mc") else "mmse" if method.startswith("mmse") else None


def _uses_mmse_samples(method: str) -> bool:
    """Whether ``mmse_samples`` changes a method's rows: MMSE's copies or its linearisation's."""
    return _sample_kind(method) == "mmse" or method in LINEARISED_MC_METHODS


def _tasks(sigmas: list[float], methods: list[str], mc: list[int], mmse: list[int]) -> list[Task]:
    counts = {"mc": mc, "mmse": mmse, None: [0]}
    return [Task(s, m, n) for s in sigmas for m in methods for n in counts[_sample_kind(m)]]


def _claim_folder(store: ResultStore, config: dict[str, Any], overwrite: bool, extend: bool) -> dict[str, Any]:
    """Create and lock the folder and check it may take this run; returns the config to keep."""
    path = store.path
    if path.exists() and not path.is_dir():
        raise ConfigError(f"out: {path} exists and is not a folder")
    try:
        store.create()
        probe = store.parts_dir / f".write-test-{os.getpid()}.tmp"
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        raise ConfigError(f"out: cannot write to {path} ({exc.strerror or _first_line(exc)})") from None
    from probust.store import FolderLockedError

    try:
        store.acquire_lock()
    except (FolderLockedError, OSError) as exc:
        raise ConfigError(f"out: {_first_line(exc)}") from None
    try:
        old = store.read_config()
    except ValueError as exc:
        raise ConfigError(f"out: {_first_line(exc)}; use overwrite=True to replace it") from None
    if overwrite or old is None:
        if old is None and store.has_results():
            if not overwrite:
                raise ConfigError(
                    f"out: {path} holds result files but no config.json; use overwrite=True to replace them"
                )
        return config
    kept = _compare(old, config, extend, path)
    return old if kept is None else kept


def _start_history(plan: RunPlan, overwrite: bool, argv: Sequence[str] | None) -> None:
    store, config = plan.store, plan.config
    if overwrite:
        store.clear()
    store.remove_temporaries()
    entry = {
        "started": _now(),
        "finished": None,
        **_versions(),
        "device": str(plan.device),
        "world_size": plan.world.world_size,
        "host": platform.node(),
        "argv": list(argv) if argv is not None else None,
    }
    config.setdefault("history", []).append(entry)
    try:
        store.write_config(config)
    except OSError as exc:
        raise ConfigError(f"out: cannot write {store.config_path} ({exc.strerror or _first_line(exc)})") from None


# -- execution -----------------------------------------------------------------------------------


def _make_estimator(plan: RunPlan, task: Task):
    kwargs: dict[str, Any] = {"seed": plan.seed, "memory_budget": plan.memory_budget}
    if plan.channels_last is not None:
        kwargs["channels_last"] = plan.channels_last
    if plan.eval_batch_size is not None:
        kwargs["batch_size"] = plan.eval_batch_size
    if task.method not in ("mc", "softmax"):
        kwargs["jacobian"] = plan.jacobian
    kind = _sample_kind(task.method)
    if task.method == "softmax":
        kwargs["temperature"] = plan.temperature
    elif task.method == "mc":
        kwargs.update(n_samples=task.n_samples, confidence=plan.ci_level, interval=plan.interval)
    elif kind == "mc":  # mc_cv, mc_is: Monte Carlo around an MMSE linearisation (mvn-cdf)
        kwargs.update(
            n_samples=task.n_samples, confidence=plan.ci_level, tol=plan.tol, mmse_samples=plan.linearisation_samples
        )
    elif kind == "mmse":
        kwargs.update(n_samples=task.n_samples, tol=plan.tol, sampling=plan.mmse_sampling)
    else:
        kwargs["tol"] = plan.tol
    if task.method in P_FAIL_METHODS and plan.p_fail:
        kwargs["p_fail"] = True
    if task.method in ADAPTIVE_METHODS and plan.mc_half_width is not None:
        kwargs["target_half_width"] = plan.mc_half_width
    sigma = None if task.method == "softmax" else task.sigma
    return make_estimator(task.method, plan.model, sigma, **kwargs)


_FIELDS = ("p", "target", "stderr", "ci_low", "ci_high", "cdf_error", *(c for c in OPTIONAL_COLUMNS if c != "n_drawn"))


def _estimate(estimator: Any, x: Tensor, target: Tensor, indices: np.ndarray) -> dict[str, np.ndarray | None]:
    """Run the estimator on points with data-set indices ``indices`` (sorted, maybe sparse)."""
    # The estimator numbers rows from index_offset, so each run of consecutive indices gets
    # its own call.
    results = [estimator(x[r], target[r], index_offset=int(indices[r.start])) for r in _runs(indices)]
    out: dict[str, np.ndarray | None] = {}
    for name in _FIELDS:
        values = [getattr(r, name) for r in results]
        out[name] = None if values[0] is None else torch.cat([v.detach().cpu() for v in values]).numpy()
    # Draws actually evaluated (Monte Carlo methods; fewer than n_samples in an adaptive run).
    drawn = [r.n_samples for r in results]
    out["n_drawn"] = None if drawn[0] is None else torch.cat([v.cpu() for v in drawn]).double().numpy()
    return out


def _clean_pass(plan: RunPlan, x: Tensor) -> tuple[Tensor, Tensor]:
    """(prediction int64 [B], softmax confidence of it float64 [B]) on the CPU."""
    step = plan.eval_batch_size or 256
    with eval_mode(plan.model), torch.no_grad():
        logits = torch.cat([plan.model(x[i : i + step]) for i in range(0, x.shape[0], step)])
    logits = logits.detach().to("cpu", torch.float64)
    prediction = logits.argmax(dim=1)
    confidence = torch.softmax(logits, dim=1).gather(1, prediction[:, None]).squeeze(1)
    return prediction, confidence


def _part_name(task: Task, indices: np.ndarray) -> str:
    return f"{task.method}-n{task.n_samples}-sigma{task.sigma!r}-{int(indices[0]):08d}-{int(indices[-1]):08d}"


def _run_unit(plan: RunPlan, estimator: Any, task: Task, block: np.ndarray, todo: np.ndarray, clean: dict) -> int:
    """Compute the rows of ``todo`` (a subset of ``block``) for ``task`` and store them as a part."""
    x, labels = _batch(plan.dataset, block)
    key = int(block[0])
    if key not in clean:
        # Always on the whole block, so the prediction does not depend on what is left to do.
        clean[key] = _clean_pass(plan, x.to(plan.device))
    prediction, confidence = clean[key]
    rows = np.isin(block, todo)
    if not rows.all():
        sel = torch.from_numpy(rows)
        x, labels, prediction, confidence = x[sel], labels[sel], prediction[sel], confidence[sel]
    target = prediction if plan.target == "prediction" else labels
    sync(plan.device)
    start = time.perf_counter()
    est = _estimate(estimator, x.to(plan.device), target.to(plan.device), todo)
    sync(plan.device)
    seconds = (time.perf_counter() - start) / len(todo)
    n = len(todo)
    plan.store.write_part(
        _part_name(task, todo),
        {
            "index": todo,
            "label": labels.numpy(),
            "prediction": prediction.numpy(),
            "target": est["target"],
            "sigma": np.full(n, task.sigma),
            "method": [task.method] * n,
            "n_samples": np.full(n, task.n_samples, dtype=np.int64),
            "p": est["p"],
            "ci_low": est["ci_low"],
            "ci_high": est["ci_high"],
            "stderr": est["stderr"],
            "confidence": confidence.numpy(),
            "cdf_error": est["cdf_error"],
            **{name: est[name] for name in OPTIONAL_COLUMNS},
            "seconds": np.full(n, seconds),
            "seed": np.full(n, plan.seed, dtype=np.int64),
        },
        metadata=plan.config["run"],
    )
    return n


def _missing(plan: RunPlan, done: dict) -> int:
    """How many rows of the plan's grid ``done`` (from ResultStore.completed) lacks."""
    empty = np.empty(0, np.int64)
    return sum(int((~np.isin(plan.indices, done.get(t.key, empty))).sum()) for t in plan.tasks)


def _progress_bar(plan: RunPlan, task: Task, total: int, initial: int):
    if not plan.show_progress:
        return None
    from tqdm.auto import tqdm

    prefix = f"[rank 0/{plan.world.world_size}] " if plan.world.distributed else ""
    return tqdm(
        total=total,
        initial=initial,
        desc=prefix + task.describe(),
        unit="pt",
        dynamic_ncols=True,
        file=sys.stderr,
        smoothing=0.1,
    )


def execute(plan: RunPlan) -> RunSummary:
    """Compute every missing row of the plan, write it to the folder, and (rank 0) merge.

    Every rank of a torchrun job calls it; each computes its share of the blocks. A progress
    bar per (sigma, method, sample count) counts points (rank 0's share under torchrun).

    Returns:
        What was done (on every rank; ``rows_computed`` counts this rank's rows).

    Raises:
        RuntimeError: rows of the grid are missing at the end (under torchrun: the output
            folder is not shared by every machine).
    """
    start = time.perf_counter()
    world, store = plan.world, plan.store
    try:
        done = store.completed()
        rows_total = len(plan.indices) * len(plan.tasks)
        present = rows_total - _missing(plan, done)
        mine = world.shard(plan.blocks())
        computed = 0
        clean: dict[int, tuple[Tensor, Tensor]] = {}
        for task in plan.tasks:
            have = done.get(task.key, np.empty(0, np.int64))
            todo = [(block, block[~np.isin(block, have)]) for block in mine]
            total = sum(len(b) for b, _ in todo)
            left = sum(len(t) for _, t in todo)
            if left == 0:
                continue
            estimator = _make_estimator(plan, task)
            bar = _progress_bar(plan, task, total, total - left)
            try:
                for block, missing in todo:
                    if len(missing):
                        computed += _run_unit(plan, estimator, task, block, missing, clean)
                        if bar is not None:
                            bar.update(len(missing))
            finally:
                if bar is not None:
                    bar.close()
        error = None
        merged = None
        world.barrier()
        if world.is_main:
            try:
                merged = _finish(plan)
            except Exception as exc:
                error = exc
        _agree(world, error)
        return RunSummary(store.path, computed, present, rows_total, time.perf_counter() - start, merged)
    finally:
        store.release_lock()
        world.close()


def _finish(plan: RunPlan) -> Path | None:
    """Rank 0, after every rank is done: check the grid is complete, merge, record the end."""
    store = plan.store
    rows = store.read()
    missing = _missing(plan, store.completed(rows))
    # A shared file system may show other machines' files a little late.
    for wait in (1, 2, 4, 8) if missing and plan.world.distributed else ():
        time.sleep(wait)
        rows = store.read()
        missing = _missing(plan, store.completed(rows))
    if missing:
        hint = "; is the output folder on a file system every machine shares?" if plan.world.distributed else ""
        raise RuntimeError(f"{missing} rows of the run are missing from {store.path} after every rank finished{hint}")
    config = plan.config
    if config.get("history"):
        config["history"][-1]["finished"] = _now()
    store.write_config(config)
    return store.merge(config, rows) if plan.merge else None


def run_estimate(
    data: str | Any,
    model: str | os.PathLike | nn.Module,
    sigmas: float | Sequence[float],
    methods: str | Sequence[str] = DEFAULT_METHODS,
    out: str | os.PathLike = "results",
    *,
    split: str = "test",
    mc_samples: int | Sequence[int] = 10_000,
    mmse_samples: int | Sequence[int] = 5,
    limit: int | None = None,
    indices: str | Sequence[int | str] | None = None,
    device: str | torch.device = "auto",
    seed: int = 0,
    batch_size: int = 256,
    eval_batch_size: int | None = None,
    memory_budget: int | str | None = None,
    jacobian: str = "auto",
    channels_last: bool | None = None,
    temperature: float = 1.0,
    target: str = "prediction",
    tol: float = 1e-4,
    ci_level: float = 0.95,
    interval: str = "wilson",
    mmse_sampling: str = "centred",
    p_fail: bool = False,
    mc_half_width: float | None = None,
    show_progress: bool = True,
    overwrite: bool = False,
    extend: bool = False,
    merge: bool = True,
    download: bool = False,
    data_root: str | os.PathLike | None = None,
    allow_pickle: bool = False,
) -> Any:
    """Score a data set with estimators of p_robust at several noise levels, into ``out``.

    The same as ``probust estimate`` on the command line. A run interrupted at any point and
    started again with the same arguments computes only what is missing; the table is then
    identical to an uninterrupted run's. Under torchrun every rank calls this and shares the work.

    Args:
        data: a data set name (``probust.data.DATASETS``) or a Dataset with
            ``ds[i] -> (x float32 [C, H, W], label)`` (``name``, ``classes``, ``subset`` and
            ``tensors`` are used when present).
        model: a model file (probust checkpoint, TorchScript, torch.export) or an ``nn.Module``
            mapping [B, C, H, W] to logits [B, num_classes] (moved to ``device``; its
            state_dict's sha256 identifies it).
        sigmas: noise standard deviations per input coordinate, in the units of x (> 0).
        methods: any of ``probust.METHODS``; default the paper's six (:data:`DEFAULT_METHODS`).
        out: the results folder (see :mod:`probust.store`).
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
        memory_budget: bytes (or a size such as "4GB") each estimator may hold at once;
            default half the memory free on the device. Row and class chunks are chosen to fit.
        jacobian: how the analytic methods get input gradients: "auto" (measured once per
            model), "loop", "vmap" or "forward" (see :class:`probust.Taylor`).
        channels_last: run convolutional models in channels_last memory format (True), or
            not (False); None: measured. With ``eval_batch_size`` and ``jacobian`` it fixes
            the execution plan, for tables identical to the bit on any machine.
        eval_batch_size: most inputs per forward pass inside the estimators; default
            each estimator's own.
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
        mc_half_width: adaptive Monte Carlo ("mc", "mc_cv"): stop drawing for a point once its
            interval's half-width is at most this (checked every 1,000 draws for "mc", 500 for
            "mc_cv"; at most ``mc_samples`` draws). The column ``n_drawn`` records the draws
            used. A run setting, part of the folder's identity. None: always ``mc_samples``.
        p_fail: also compute the failure probability 1 - p directly, with relative accuracy,
            for the analytic methods (taylor, mmse, taylor_mvs, mmse_mvs; columns ``p_fail``
            and ``p_fail_error``, see :func:`probust.store.read_results`). Free for the
            mv-sigmoid; for the mvn-cdf up to C - 1 extra QMC integrals per point, so off by
            default. ``mc_is`` always fills these columns. A run setting: a folder computed
            without it cannot be extended with it (use another ``out``, or ``overwrite``).
        show_progress: a progress bar per (sigma, method, sample count).
        overwrite: replace the results of a different run in ``out``.
        extend: add this grid (more points, sigmas, methods, sample counts) to a folder holding
            results of the same data, model and settings.
        merge: compact the parts into ``results.parquet`` at the end.
        download: fetch a missing data set.
        data_root: folder holding the data sets.
        allow_pickle: accept model files that run code when loaded (pickled modules).

    Returns:
        The results table as :func:`probust.store.read_results` gives it (every row in ``out``,
        including those of earlier runs added with ``extend``).

    Raises:
        ConfigError: a bad argument, found before any work starts.
        ConfigMismatchError: ``out`` holds results of a different run.
    """
    arguments = dict(locals())
    plan = prepare(**arguments)
    if plan.world.is_main:
        for note in plan.warnings:
            warnings.warn(note, UserWarning, stacklevel=2)
    execute(plan)
    return read_results(plan.store.path)
