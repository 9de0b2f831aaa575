"""The results folder of a run: its configuration, claiming it, and the rules for resuming and extending.

A folder takes the rows of one run: the same data, model and settings (``config.json``'s "run").
A call with the same grid resumes it; with ``extend`` a call may add to the grid (recorded as
another entry of "requests"); with ``overwrite`` it replaces the folder's contents. Each process
that writes into the folder adds an entry to its "history".

Resuming and extending are refused across versions: a folder whose ``format_version`` differs
from this version's always; and one that another probust version wrote into (``probust_version``
of the config and of each history entry; none recorded counts as another) unless
``allow_version_change``, which the history entry then records. The table has no column saying
which version computed a row, so rows of two versions would mix silently otherwise.
"""

from __future__ import annotations

import datetime as _dt
import os
import platform
import re
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from probust.errors import Setting, first_parts
from probust.run.distributed import World
from probust.run.errors import ConfigError, ConfigMismatchError, first_line
from probust.run.files import Layout
from probust.run.indices import index_ranges
from probust.run.methods import LINEARISED_MC_METHODS, sample_kind, uses_mmse_samples
from probust.run.prepared import PreparedRun
from probust.run.results_config import ResultsConfig
from probust.run.sources import config_value, data_name, data_split, hash_data, input_shape, num_classes
from probust.run.store import (
    FORMAT,
    FORMAT_VERSION,
    FolderLockedError,
    ResultsLinkError,
    ResultStore,
)

__all__ = ["claim_folder", "new_config", "now", "request", "start_history"]

#: The copies those methods used before the runner passed ``mmse_samples`` on (MonteCarloCV's
#: default), implied by a folder's request that recorded no ``mmse_samples`` for them.
_LEGACY_LINEARISATION_SAMPLES = 5
OVERWRITE, OUT = Setting("overwrite", True), Setting("out")


def now() -> str:
    """The time now, UTC, ISO 8601 to the second."""
    return _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")


def _versions() -> dict[str, str]:
    from probust import __version__

    return {"probust_version": __version__, "torch_version": torch.__version__}


def request(
    sigmas: Sequence[float],
    methods: Sequence[str],
    mc_samples: Sequence[int],
    mmse_samples: Sequence[int],
    indices: np.ndarray,
) -> dict[str, Any]:
    """The "requests" entry of a call: its grid (lists, as JSON reads them back).

    Sample counts a run's methods do not use are left out, so they cannot make two runs differ.
    """
    return {
        "sigmas": list(sigmas),
        "methods": list(methods),
        "mc_samples": list(mc_samples) if any(sample_kind(m) == "mc" for m in methods) else [],
        "mmse_samples": list(mmse_samples) if any(uses_mmse_samples(m) for m in methods) else [],
        "n_points": int(len(indices)),
        "indices": index_ranges(indices),
    }


def _show(value: Any, limit: int = 60) -> str:
    text = str(value)
    if re.fullmatch(r"[0-9a-f]{64}", text):  # a sha256: its start tells two apart
        return text[:12] + "..."
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _written_by(old: ResultsConfig) -> list[str | None]:
    """The probust versions of the processes that wrote into a folder (None: not recorded),
    the one that created it first, each once."""
    versions = [old.probust_version, *(h.probust_version for h in old.history)]
    return list(dict.fromkeys(versions))


def _check_versions(old: ResultsConfig, new: dict[str, Any], path: Path, allow_version_change: bool) -> None:
    """Refuse to add rows to a folder written in another results format, or (unless allowed) by
    another probust version: the table has no column telling which version computed a row, and
    two versions' rows may differ (an estimator fixed or changed in between)."""
    way_out = ("use ", OVERWRITE, " to replace them, or another ", OUT, " folder")
    if old.format_version != new["format_version"]:
        there = "no format version" if old.format_version is None else f"format version {old.format_version}"
        raise ConfigMismatchError(
            f"{path} holds results in {there} (probust {old.probust_version or 'unknown'}), this probust "
            f"({new['probust_version']}) writes format version {new['format_version']}; ",
            *way_out,
            differences=[f"format_version: {old.format_version} there, {new['format_version']} here"],
            path=path,
        )
    others = [v for v in _written_by(old) if v != new["probust_version"]]
    if others and not allow_version_change:
        there = ", ".join("an unrecorded version" if v is None else v for v in others)
        raise ConfigMismatchError(
            f"{path} holds results written by probust {there}, this is probust {new['probust_version']} and "
            "its rows could differ; ",
            *way_out,
            " (or ",
            Setting("allow_version_change", True),
            " to mix them)",
            differences=[f"probust_version: {there} there, {new['probust_version']} here"],
            path=path,
        )


def _compare(
    found: Any,
    new: dict[str, Any],
    extend: bool,
    path: Path,
    allow_version_change: bool = False,
    layout: Layout | None = None,
) -> dict[str, Any] | None:
    """The config to write when ``new`` may go into a folder holding ``found`` (its
    ``config.json`` as read); None to keep it. ``layout``: the folder's kind, whose ``implied``
    reads an older "run" section and whose ``resumable`` settings a refusal names with the
    folder's values.

    Raises:
        ConfigMismatchError: naming what differs.
    """
    try:
        old: ResultsConfig | None = ResultsConfig.from_dict(found)
    except ValueError:
        old = None
    if old is None or old.format != new["format"]:
        what = "probust results" if new["format"] == FORMAT else new["format"]
        # The other command's folder (probust estimate's or probust certify's): say so.
        found_text = f" but {old.format}'s" if old is not None and (old.format or "").startswith("probust.") else ""
        raise ConfigMismatchError(
            f"{path}/config.json is not a {what} configuration{found_text}; use ",
            OVERWRITE,
            " to replace it, or another ",
            OUT,
            " folder",
            path=path,
        )
    _check_versions(old, new, path, allow_version_change)
    # Everything under "run" must match: the data, the model and the settings of the estimators
    # (a setting newer than the folder's config counts as its default there).
    old_run = old.run_values
    if layout is not None and layout.implied is not None:
        old_run = layout.implied(old_run)
    keys = list(new["run"]) + [k for k in old_run if k not in new["run"]]
    differing = [k for k in keys if old_run.get(k) != new["run"].get(k)]
    diffs = [f"{k}: {_show(old_run.get(k))} there, {_show(new['run'].get(k))} here" for k in differing]
    if diffs:
        resumable = layout.resumable if layout is not None else ()
        # Settings the user may give the folder's value of, where nothing else differs.
        resume: list[Any] = []
        if all(k in resumable for k in differing):
            for k in differing:
                resume += [Setting(k, old_run[k]), ", "]
            resume[-1] = " to resume it, "
        raise ConfigMismatchError(
            f"{path} holds results of a different run ({'; '.join(diffs)}); use ",
            *resume,
            OVERWRITE,
            " to replace them, or another ",
            OUT,
            " folder",
            differences=diffs,
            path=path,
        )
    request = new["requests"][0]
    old_requests = [_with_legacy_defaults(r) for r in old.requests]
    if request in old_requests:
        return None
    if extend:
        _check_linearisation(old_requests, request, path)
        return {**old.raw, "requests": [*old.requests, request]}
    last = old_requests[-1] if old_requests else {}
    diffs = [
        f"{k}: {_show(last.get(k))} there, {_show(request.get(k))} here"
        for k in request
        if last.get(k) != request.get(k)
    ]
    raise ConfigMismatchError(
        f"{path} holds results of a different run ({'; '.join(diffs)}); use ",
        Setting("extend", True),
        " to add these rows to it, ",
        OVERWRITE,
        " to replace it, or another ",
        OUT,
        " folder",
        differences=diffs,
        path=path,
    )


def _with_legacy_defaults(request: dict[str, Any]) -> dict[str, Any]:
    """A request as this version records it: mc_cv and mc_is imply their MMSE copies."""
    if not request.get("mmse_samples") and any(m in LINEARISED_MC_METHODS for m in request.get("methods", ())):
        return {**request, "mmse_samples": [_LEGACY_LINEARISATION_SAMPLES]}
    return request


def _linearisation_samples(request: dict[str, Any]) -> int | None:
    """The MMSE copies of a request's mc_cv and mc_is rows; None when it has neither."""
    if not any(m in LINEARISED_MC_METHODS for m in request.get("methods", ())) or not request.get("mmse_samples"):
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
        differences=[diff],
        path=path,
    )


def new_config(
    ds: Any,
    split: str,
    model_info: dict,
    settings: dict,
    request: dict,
    dev: torch.device,
    world: World,
    format: str = FORMAT,
) -> dict[str, Any]:
    """The ``config.json`` of a new folder for this run (``format``: its layout's, by default
    ``probust estimate``'s)."""
    return {
        "format": format,
        "format_version": FORMAT_VERSION,
        "run": {
            "dataset": data_name(ds),
            "split": data_split(ds, split),
            "data_size": len(ds),
            "data_sha256": hash_data(ds),
            "model_sha256": model_info["sha256"],
            **settings,
        },
        "requests": [request],
        "model": model_info,
        "data": {
            "input_shape": list(input_shape(ds)),
            "num_classes": num_classes(ds),
            "classes": config_value(list(getattr(ds, "classes", []) or [])),
            "source": str(getattr(ds, "source", "")),
            # A user's file: its format and options (a table's feature columns, an image size).
            **({"details": config_value(ds.details)} if getattr(ds, "details", None) else {}),
        },
        "created": now(),
        **_versions(),
        "device": str(dev),
        "world_size": world.world_size,
        "history": [],
    }


def claim_folder(
    store: ResultStore, config: dict[str, Any], overwrite: bool, extend: bool, allow_version_change: bool = False
) -> dict[str, Any]:
    """Create and lock the folder and check it may take this run; returns the config to keep.

    Resuming or extending (not ``overwrite``) a folder is refused when its results format
    differs from this version's, or when another probust version wrote into it (unless
    ``allow_version_change``), as well as when its run differs (see :func:`_compare`)."""
    path = store.path
    if path.exists() and not path.is_dir():
        raise ConfigError(f"{path} exists and is not a folder", field="out")
    try:
        store.create()
        # A new name of its own (O_EXCL): an existing file or link of that name is never opened.
        fd, probe = tempfile.mkstemp(dir=store.parts_dir, prefix=".write-test-", suffix=".tmp")
        os.close(fd)
        # missing_ok: a run holding the folder may clean temporaries meanwhile
        Path(probe).unlink(missing_ok=True)
    except ResultsLinkError as exc:
        raise ConfigError(*first_parts(exc), field="out") from None
    except OSError as exc:
        raise ConfigError(f"cannot write to {path} ({exc.strerror or first_line(exc)})", field="out") from None
    try:
        store.acquire_lock()
    except (FolderLockedError, OSError) as exc:
        raise ConfigError(f"{first_line(exc)}", field="out") from None
    try:
        old = store.read_config()
    except ValueError as exc:
        raise ConfigError(f"{first_line(exc)}; use ", OVERWRITE, " to replace it", field="out") from None
    if overwrite or old is None:
        if old is None and store.has_results():
            if not overwrite:
                raise ConfigError(
                    f"{path} holds result files but no config.json; use ", OVERWRITE, " to replace them", field="out"
                )
        return config
    kept = _compare(old, config, extend, path, allow_version_change, store.layout)
    return old if kept is None else kept


def start_history(
    plan: PreparedRun, overwrite: bool, argv: Sequence[str] | None, allow_version_change: bool = False
) -> None:
    """Rank 0, once every rank has prepared: clear the folder if asked, and record this process
    (with ``allow_version_change`` when it was given)."""
    store, config = plan.store, plan.config
    if overwrite:
        store.clear()
    store.remove_temporaries()
    entry = {
        "started": now(),
        "finished": None,
        **_versions(),
        "device": str(plan.device),
        "world_size": plan.world.world_size,
        "host": platform.node(),
        "argv": list(argv) if argv is not None else None,
    }
    if allow_version_change:
        entry["allow_version_change"] = True
    config.setdefault("history", []).append(entry)
    try:
        store.write_config(config)
    except OSError as exc:
        raise ConfigError(
            f"cannot write {store.config_path} ({exc.strerror or first_line(exc)})", field="out"
        ) from None
