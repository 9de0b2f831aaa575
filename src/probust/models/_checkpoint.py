"""probust checkpoints: saving, reading and checking them against what a run expects.

A probust checkpoint is a ``torch.save`` zip holding ``{"format": "probust.checkpoint",
"format_version": 1, "meta": {...}, "state_dict": {...}, "train_state": {...} | None}``; it is
loaded with ``weights_only=True`` (no code runs) and the model is rebuilt from ``meta`` by
:func:`probust.models.build`. Next to it, ``<path>.json`` holds the same ``meta`` for people and
scripts.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import sys
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

import torch
from torch import nn

from probust._io import atomic_write
from probust._untrusted import torch_load
from probust.errors import ProbustError, first_line
from probust.models._registry import ARCHS, spec_of

FORMAT = "probust.checkpoint"
FORMAT_VERSION = 1


class CheckpointError(ProbustError, ValueError):
    """A model file cannot be loaded: unknown format, damaged, or not self-describing."""


class CheckpointMismatchError(CheckpointError):
    """A model file holds another architecture, class count, input shape or data set than expected."""


def sidecar_path(path: str | os.PathLike) -> Path:
    """The JSON metadata file written next to a checkpoint: ``<path>.json``."""
    path = Path(path)
    return path.with_name(path.name + ".json")


def probust_version() -> str:
    pkg = sys.modules.get("probust")
    version = getattr(pkg, "__version__", None)
    if version:
        return str(version)
    try:
        from importlib.metadata import version as _dist_version

        return _dist_version("probust")
    except Exception:
        return "unknown"


def save_checkpoint(
    path: str | os.PathLike,
    model: nn.Module,
    meta: dict[str, Any] | None = None,
    *,
    train_state: dict[str, Any] | None = None,
    sidecar: bool = True,
) -> Path:
    """Saves a model built by :func:`probust.models.build`, atomically, with its metadata.

    Args:
        path: destination, conventionally ``*.pt``.
        model: a model from :func:`probust.models.build` (its architecture is recorded), or any
            module whose ``meta`` gives ``arch``, ``num_classes`` and ``input_shape`` of a
            registered architecture.
        meta: JSON-serialisable metadata (data set, lambda, accuracy, ...). ``arch``,
            ``num_classes``, ``input_shape``, ``arch_kwargs``, ``probust_version`` and ``created``
            are filled in when absent.
        train_state: optimiser/scheduler state for resuming training (tensors allowed).
        sidecar: also write ``meta`` as JSON to :func:`sidecar_path` (atomically too).

    Returns:
        The checkpoint path.

    Raises:
        CheckpointError: the model's architecture is unknown, or ``meta`` is not JSON-serialisable.
    """
    path = Path(path)
    full = dict(spec_of(model) or {})
    full.update(meta or {})
    if full.get("arch") not in ARCHS or "num_classes" not in full or "input_shape" not in full:
        raise CheckpointError(
            "save_checkpoint needs a model from probust.models.build (or meta with a known 'arch', "
            "'num_classes' and 'input_shape'); save other models with torch.export.save"
        )
    full.setdefault("arch_kwargs", {})
    full.setdefault("probust_version", probust_version())
    full.setdefault("created", _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
    try:
        text = json.dumps(full, indent=2, sort_keys=True)
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"meta must be JSON-serialisable: {exc}") from None
    payload = {
        "format": FORMAT,
        "format_version": FORMAT_VERSION,
        "meta": json.loads(text),
        "state_dict": {k: v.detach().cpu() for k, v in model.state_dict().items()},
        "train_state": train_state,
    }
    atomic_write(path, lambda f: torch.save(payload, f))
    if sidecar:
        atomic_write(sidecar_path(path), lambda f: f.write((text + "\n").encode()))
    return path


def zip_kind(path: Path) -> str | None:
    try:
        with zipfile.ZipFile(path) as z:
            names = z.namelist()
    except (zipfile.BadZipFile, OSError):
        return None
    tails = {n.split("/", 1)[1] if "/" in n else n for n in names}
    if "archive_format" in tails or any(t.startswith("models/") for t in tails):
        return "export"
    if "constants.pkl" in tails or any(t.startswith("code/") for t in tails):
        return "torchscript"
    if "data.pkl" in tails:
        return "torch.save"
    return None


def read_checkpoint(path: str | os.PathLike, map_location: Any = "cpu") -> dict[str, Any]:
    """The raw payload of a probust checkpoint (meta, state_dict, train_state).

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: not a probust checkpoint.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    try:
        payload = torch_load(
            path,
            allow_pickle=None,
            error=CheckpointError,
            advice="a probust checkpoint holds tensors only (probust.models.save_checkpoint)",
            map_location=map_location,
        )
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: not a probust checkpoint ({type(exc).__name__}: {first_line(exc)})") from None
    if not isinstance(payload, dict) or payload.get("format") != FORMAT:
        raise CheckpointError(f"{path}: not a probust checkpoint")
    return check_version(path, payload)


def check_version(path: Path, payload: dict[str, Any]) -> dict[str, Any]:
    if int(payload.get("format_version", 0)) > FORMAT_VERSION:
        raise CheckpointError(
            f"{path}: checkpoint format {payload['format_version']} is newer than this probust "
            f"reads ({FORMAT_VERSION}); upgrade probust"
        )
    return payload


def check_compatible(
    meta: dict[str, Any],
    *,
    arch: str | None = None,
    num_classes: int | None = None,
    input_shape: Sequence[int] | None = None,
    dataset: str | None = None,
    source: str = "checkpoint",
) -> None:
    """Refuses metadata that does not match what the caller needs.

    Args:
        meta: a model's metadata (from :func:`load_model`).
        arch, num_classes, input_shape, dataset: what is expected; None skips that check.
        source: how to name the model in the message.

    Raises:
        CheckpointMismatchError: naming every mismatched field, e.g.
            ``checkpoint mismatch: num_classes is 100, expected 10``.
    """
    wanted = {"arch": arch, "num_classes": num_classes, "input_shape": input_shape, "dataset": dataset}
    problems = []
    for key, want in wanted.items():
        if want is None:
            continue
        have = meta.get(key)
        if key == "input_shape":
            want = [int(s) for s in cast(Sequence[int], want)]
            have = [int(s) for s in have] if have is not None else None
        elif key == "dataset":
            want, have = _dataset_key(want), _dataset_key(have) if have is not None else None
        if have is None:
            problems.append(f"{key} is not recorded, expected {want}")
        elif have != want:
            problems.append(f"{key} is {have}, expected {want}")
    if problems:
        raise CheckpointMismatchError(f"{source} mismatch: " + "; ".join(problems))


def _dataset_key(name: Any) -> str:
    from probust.data import canonical_name

    try:
        return canonical_name(str(name))
    except ValueError:
        return str(name)
