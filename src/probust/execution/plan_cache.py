"""Where measured execution plans are kept: per model object in memory, and on disk.

A plan (rows per pass, memory format, Jacobian strategy) is measured once and then reused, so
that every later call, and every later run on the same machine, computes with the same plan
and so gives the same numbers to the last bit. What a plan depends on is the model's
structure (its modules and parameter shapes, not their values), the device, the torch
version and thread count, and the input shape; that is the key on disk.

The disk cache is one small JSON file, ``$PROBUST_CACHE_DIR/plans.json`` (default
``$XDG_CACHE_HOME/probust`` or ``~/.cache/probust``); ``PROBUST_CACHE_DIR=off`` keeps plans in
memory only. A cache that cannot be read or written is ignored: plans are then measured again.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import json
import os
import platform
from pathlib import Path
from typing import Any

import torch
from torch import nn

from probust._io import atomic_write_text
from probust._per_model import PerModel

CACHE_ENV = "PROBUST_CACHE_DIR"
_FILE = "plans.json"
# 2: entries of earlier versions are measured again: their pass costs may hold torch's first-call
# import of its symbolic shapes (0.85 s, probust.gradients.pull_back) timed into a small model's first
# pullback, and a CPU plan may have taken vmap on a trial it won by noise (tuning.VMAP_PAYS).
# 3: forward-mode passes skip the tangents of weights (probust._forward_mode): jvp costs measured
# before are up to 1.5x too high.
_VERSION = 3

# Per model object, while its structure stays (probust._per_model): a new head or layer makes
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


def _read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text())
    except (OSError, ValueError):
        return {}
    return data.get("plans", {}) if isinstance(data, dict) and data.get("version") == _VERSION else {}


def lookup(model: Any, key: str, kind: type) -> Any | None:
    """The plan of ``kind`` (a dataclass) stored under ``key``: from memory, else from disk."""
    found = _MEMORY.get(model, key)
    if found is not None:
        return found
    path = cache_path()
    if path is None:
        return None
    stored = _read(path).get(key)
    if not isinstance(stored, dict):
        return None
    try:
        plan = kind(**stored)
    except TypeError:  # a plan of an older shape: measure again
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
