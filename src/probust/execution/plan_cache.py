"""Where measured execution plans are kept: per model object in memory, and on disk.

A plan (rows per pass, memory format, Jacobian strategy) is measured once and then reused, so
that every later call, and every later run on the same machine, computes with the same plan
and so gives the same numbers to the last bit. What a plan depends on is the model's
structure (its modules and parameter shapes, not their values), the device, the torch
version and thread count, and the input shape; that is the key on disk.

The disk cache is one small JSON file, ``$PROBUST_CACHE_DIR/plans.json`` (default
``$XDG_CACHE_HOME/probust`` or ``~/.cache/probust``); ``PROBUST_CACHE_DIR=off`` keeps plans in
memory only. A cache that cannot be read or written is ignored: plans are then measured again.

The file is data, not trust: it may have been edited by hand or written by another version. Each
entry is checked against the fields and types of the plan it is read as (a count is an integer
of at least 1, a switch a bool, a strategy one of its names); an entry that does not fit, or a
file that is not a plans file, is not used and the plan is measured again, with one
``UserWarning`` naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import enum
import hashlib
import json
import os
import platform
import types
import typing
import warnings
from pathlib import Path
from typing import Any

import torch
from torch import nn

from probust._io import atomic_write_text
from probust._user_model import PerModel

CACHE_ENV = "PROBUST_CACHE_DIR"
_FILE = "plans.json"
# Entries of another version are measured again. Version 1's pass costs may include torch's
# first-call import of its symbolic shapes, which probust.linearisation.pullback.pull_back avoids, timed into a
# small model's first pullback, and its CPU plans may take vmap on a trial won by noise
# (jacobian_plans.VMAP_PAYS); version 2's jvp costs include the weights' zero tangents that
# probust.linearisation.forward_mode skips, so they overstate a forward-mode pass.
_VERSION = 3

# Per model object, while its structure stays (probust._user_model): a new head or layer makes
# another network, whose signature and plans are read again.
_MEMORY: PerModel[Any] = PerModel()
_SIGNATURES: PerModel[str] = PerModel()


def cache_path() -> Path | None:
    """The plans file, or None when the disk cache is off."""
    root = os.environ.get(CACHE_ENV)
    if root is not None and root.strip().lower() in ("", "off", "none", "0"):
        return None
    if root is None:
        base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
        root = os.path.join(base, "probust")
    return Path(root) / _FILE


def _device_name(device: torch.device) -> str:
    if device.type == "cuda":
        return torch.cuda.get_device_name(device)
    return platform.processor() or platform.machine()


def model_signature(model: Any) -> str:
    """A digest of what a model's speed depends on: its class, module tree and parameter shapes."""
    known = _SIGNATURES.get(model, None)
    if known is not None:
        return known
    digest = hashlib.sha256(f"{type(model).__module__}.{type(model).__qualname__}".encode())
    if isinstance(model, nn.Module):
        digest.update(repr(model).encode())
        for name, tensor in [*model.named_parameters(), *model.named_buffers()]:
            digest.update(f"{name}:{tuple(tensor.shape)}:{tensor.dtype}:{tensor.requires_grad};".encode())
    signature = digest.hexdigest()[:20]
    _SIGNATURES.put(model, None, signature)
    return signature


def plan_key(model: Any, device: torch.device, parts: tuple) -> str:
    """The key of a plan: model signature, device, software and the caller's ``parts``."""
    return json.dumps(
        [
            model_signature(model),
            str(device),
            _device_name(device),
            torch.__version__,
            torch.get_num_threads(),
            [str(p) for p in parts],
        ],
        separators=(",", ":"),
    )


# What was warned about already in this process (a file, or a file and key): once each.
_WARNED: set[tuple[str, ...]] = set()


def _warn_once(what: tuple[str, ...], message: str) -> None:
    if what not in _WARNED:
        _WARNED.add(what)
        warnings.warn(message, UserWarning, stacklevel=4)


def _read(path: Path) -> dict[str, Any]:
    """The plans of ``path`` by key ({} for a missing file, another version's, or one that is not
    a plans file, which is warned about once)."""
    try:
        text = path.read_text()
    except OSError:
        return {}
    try:
        data = json.loads(text)
    except ValueError:
        data = None
    if isinstance(data, dict) and data.get("version") != _VERSION:
        return {}  # another version's plans: measured again, silently
    plans = data.get("plans") if isinstance(data, dict) else None
    if not isinstance(plans, dict):
        _warn_once(
            (str(path),),
            f"{path} is not a probust plans file; its plans are not used and are measured again "
            f"(delete it, or set {CACHE_ENV}=off)",
        )
        return {}
    return plans


def _fits(value: Any, kind: Any) -> bool:
    """Whether a value read from JSON is one of the type ``kind`` (a plan field's annotation).

    Integers in a plan are counts (rows, classes per pass): at least 1."""
    if kind is type(None):
        return value is None
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        return any(_fits(value, arm) for arm in typing.get_args(kind))
    if kind is bool:
        return isinstance(value, bool)
    if kind is int:
        return isinstance(value, int) and not isinstance(value, bool) and value >= 1
    if kind is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is str:
        return isinstance(value, str)
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        return any(value == member.value for member in kind)
    return False


def _problem(stored: Any, kind: type) -> str | None:
    """What makes ``stored`` (an entry of the file) no plan of ``kind``; None when it is one."""
    if not isinstance(stored, dict):
        return f"a {type(stored).__name__}, not an object"
    fields = [f for f in dataclasses.fields(kind) if f.init]
    names = {f.name for f in fields}
    if set(stored) != names:
        return f"its fields are {sorted(map(str, stored))}, expected {sorted(names)}"
    hints = typing.get_type_hints(kind)
    for f in fields:
        if not _fits(stored[f.name], hints[f.name]):
            return f"{f.name} is {stored[f.name]!r}, expected {hints[f.name]}"
    return None


def lookup(model: Any, key: str, kind: type) -> Any | None:
    """The plan of ``kind`` (a dataclass) stored under ``key``: from memory, else from disk.

    An entry on disk that is not a plan of ``kind`` (:func:`_problem`) is not used: None, and
    one ``UserWarning`` naming the file."""
    found = _MEMORY.get(model, key)
    if found is not None:
        return found
    path = cache_path()
    if path is None:
        return None
    stored = _read(path).get(key)
    if stored is None:
        return None
    problem = _problem(stored, kind)
    if problem is None:
        try:
            plan = kind(**stored)
        except (TypeError, ValueError) as exc:  # refused by the plan itself
            problem = str(exc)
    if problem is not None:
        _warn_once(
            (str(path), key),
            f"{path}: a cached {kind.__name__} is not valid ({problem}); it is not used and is measured again",
        )
        return None
    _MEMORY.put(model, key, plan)
    return plan


def store(model: Any, key: str, plan: Any) -> None:
    """Keep ``plan`` in memory for ``model`` and on disk under ``key`` (atomically; errors ignored)."""
    _MEMORY.put(model, key, plan)
    path = cache_path()
    if path is None:
        return
    with contextlib.suppress(OSError):
        path.parent.mkdir(parents=True, exist_ok=True)
        plans = _read(path)
        plans[key] = dataclasses.asdict(plan)
        text = json.dumps({"version": _VERSION, "plans": plans}, indent=1, sort_keys=True)
        atomic_write_text(path, text, durable=False)  # a cache: losing it costs a re-measurement


def forget(model: Any) -> None:
    """Drop ``model``'s plans from memory (the disk cache is keyed by structure and stays)."""
    _MEMORY.forget(model)
