"""``find_issues(..., out=DIR)``: the per-chunk results kept on disk, so that an interrupted call
(or ``probust issues`` run again) computes only what is missing.

DIR holds ``issues.json`` (what the results depend on: sigma, seed, the points and which part
scores each, every model's parameter fingerprint) and one ``part{k}_{start}.npz`` per chunk of
part k's points (plain arrays, read without pickle). A folder whose ``issues.json`` differs is
refused rather than mixed.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from probust._io import atomic_write_bytes
from probust.run import ConfigMismatchError

__all__ = ["ChunkStore", "fingerprint"]

_CONFIG = "issues.json"


def fingerprint(model: nn.Module) -> str:
    """A hash of the model's parameters and buffers (their names, shapes and values)."""
    digest = hashlib.sha256()
    for name, tensor in model.state_dict().items():
        digest.update(name.encode())
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().to("cpu").contiguous().view(-1).view(torch.uint8).numpy().tobytes())
    return digest.hexdigest()[:16]


class ChunkStore:
    """The chunks of one call in ``folder`` (None: nothing is written, nothing is found)."""

    def __init__(self, folder: str | os.PathLike | None, config: dict[str, Any]) -> None:
        self.folder = None if folder is None else Path(folder)
        if self.folder is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        path = self.folder / _CONFIG
        text = json.dumps(config, indent=2, sort_keys=True) + "\n"
        if path.exists():
            there = json.loads(path.read_text())
            differences = [
                f"{key}: {there.get(key)!r} there, {config.get(key)!r} here"
                for key in sorted(set(there) | set(config))
                if there.get(key) != config.get(key)
            ]
            if differences:
                raise ConfigMismatchError(
                    f"{self.folder} holds the issues of another call ({differences[0]}); use another out folder",
                    field="out",
                    differences=differences,
                )
        else:
            atomic_write_bytes(path, text.encode())

    def _path(self, part: int, start: int) -> Path:
        assert self.folder is not None
        return self.folder / f"part{part}_{start}.npz"

    def load(self, part: int, start: int) -> dict[str, np.ndarray] | None:
        if self.folder is None or not self._path(part, start).exists():
            return None
        with np.load(self._path(part, start), allow_pickle=False) as stored:
            return {key: stored[key] for key in stored.files}

    def save(self, part: int, start: int, arrays: dict[str, np.ndarray]) -> None:
        if self.folder is None:
            return
        import io

        buffer = io.BytesIO()
        np.savez(buffer, **arrays)  # type: ignore[arg-type]
        atomic_write_bytes(self._path(part, start), buffer.getvalue())
