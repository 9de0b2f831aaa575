"""Hostile files built by the tests themselves (no payload is committed): a pickle whose
unpickling creates a marker file stands for an attacker's code, so a test proves that nothing
ran by asserting that the marker does not exist. Import as ``from tests._crafted import ...``.
"""

from __future__ import annotations

import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn


class Marker:
    """Unpickling it opens ``path`` for writing: it creates the file (the attacker's code)."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, "w"))


def torch_pickle(obj) -> bytes:
    """``torch.save(obj)``'s bytes."""
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def export_model() -> nn.Module:
    """The model of :func:`save_clean_archive`: [B, 1, 4, 4] -> [B, 3] logits (seed 0)."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()


def save_clean_archive(path: Path) -> Path:
    """A clean ``torch.export.save`` archive of :func:`export_model` with a dynamic batch."""
    program = torch.export.export(
        export_model(), (torch.zeros(2, 1, 4, 4),), dynamic_shapes=({0: torch.export.Dim("batch")},)
    )
    torch.export.save(program, str(path))
    return path


def rewrite_archive(
    clean: Path, out: Path, change: Callable[[str, bytes], bytes] | None = None, add: dict[str, bytes] | None = None
) -> Path:
    """A copy of ``clean`` with each entry's bytes passed through ``change(name inside the
    archive's folder, bytes)``, and the entries ``add`` (names inside the folder) appended."""
    with zipfile.ZipFile(clean) as source, zipfile.ZipFile(out, "w") as target:
        top = source.namelist()[0].split("/", 1)[0]
        for entry in source.infolist():
            inner = entry.filename.split("/", 1)[1]
            data = source.read(entry)
            target.writestr(entry.filename, change(inner, data) if change else data)
        for inner, data in (add or {}).items():
            target.writestr(f"{top}/{inner}", data)
    return out


def json_change(inner_name: str, edit: Callable[[dict], None]) -> Callable[[str, bytes], bytes]:
    """A ``change`` for :func:`rewrite_archive` that edits one JSON entry in place."""

    def change(inner: str, data: bytes) -> bytes:
        if inner != inner_name:
            return data
        value = json.loads(data)
        edit(value)
        return json.dumps(value).encode()

    return change


def pickled_weight_archive(clean: Path, out: Path, marker: Path) -> Path:
    """``clean`` with its first weight marked ``use_pickle`` in the weights config and its file a
    pickle of a :class:`Marker` (torch 2.14 unpickles it with ``weights_only=False``)."""

    def change(inner: str, data: bytes) -> bytes:
        if inner == "data/weights/model_weights_config.json":
            config = json.loads(data)
            first = next(iter(config["config"].values()))
            first["use_pickle"] = True
            return json.dumps(config).encode()
        if inner == "data/weights/weight_0":
            return torch_pickle(Marker(marker))
        return data

    return rewrite_archive(clean, out, change)
