"""Loading a model from any file probust accepts: a probust checkpoint (rebuilt from its meta),
a TorchScript file, a ``torch.export`` program, or (with ``allow_pickle``) a pickled module.

Every file is read through :mod:`probust._untrusted`: whatever it is called, content that would
run code when loaded (pickled objects, a ``torch.export`` archive's pickled payloads, native
libraries or shape expressions that are Python code) is refused unless ``allow_pickle``.
"""

from __future__ import annotations

import io
import json
import os
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from probust import _inputs
from probust._untrusted import check_export_archive, torch_load
from probust.errors import Phrase, first_line
from probust.models._checkpoint import (
    FORMAT,
    CheckpointError,
    CheckpointMismatchError,
    check_compatible,
    check_version,
    zip_kind,
)
from probust.models._registry import build

_TS_META = "probust_meta.json"  # optional extra file in a TorchScript archive
#: How to save a model so that loading it runs no code (ends a refusal's message).
SAFE_SAVE = "save the model with probust.models.save_checkpoint or torch.export"


class ExportedModel(nn.Module):
    """A ``torch.export`` program as an ordinary module.

    ``ExportedProgram.module()`` refuses ``train()``/``eval()``; the program was captured in one
    mode and stays in it, so mode switches are accepted and ignored here. A program exported with
    a fixed batch size is fed in chunks of that size (the last one zero-padded), so that any batch
    size works.

    Args:
        module: ``ExportedProgram.module()``.
        batch_size: the fixed batch size of the program, or None if its batch dimension is dynamic.
    """

    def __init__(self, module: nn.Module, batch_size: int | None = None) -> None:
        super().__init__()
        self.program = module
        self.batch_size = batch_size

    def train(self, mode: bool = True) -> ExportedModel:
        self.training = mode  # no recursion: the exported module raises on train()/eval()
        return self

    def forward(self, x: Tensor) -> Tensor:
        if self.batch_size is None or x.shape[0] == self.batch_size:
            return self.program(x)
        outs = []
        for chunk in x.split(self.batch_size):
            n = chunk.shape[0]
            if n < self.batch_size:
                pad = chunk.new_zeros((self.batch_size - n, *chunk.shape[1:]))
                chunk = torch.cat([chunk, pad])
            outs.append(self.program(chunk)[:n])
        return torch.cat(outs)


def _load_export(path: Path, allow_pickle: bool) -> tuple[nn.Module, dict[str, Any]]:
    data = path.read_bytes()  # checked and loaded from the same bytes
    if not allow_pickle:
        check_export_archive(data, name=path, error=CheckpointError, advice=SAFE_SAVE)
    program = torch.export.load(io.BytesIO(data))
    user_inputs = set(program.graph_signature.user_inputs)
    shape = None
    for node in program.graph.nodes:
        if node.op == "placeholder" and node.name in user_inputs:
            val = node.meta.get("val")
            shape = tuple(val.shape) if val is not None else None
            break
    meta: dict[str, Any] = {"format": "torch.export"}
    batch_size = None
    if shape is not None and len(shape) >= 1:
        if isinstance(shape[0], int):
            batch_size = int(shape[0])
        if all(isinstance(s, int) for s in shape[1:]):
            meta["input_shape"] = [int(s) for s in shape[1:]]
    meta["batch_size"] = batch_size if batch_size is not None else "dynamic"
    # No guards: module() would compile the archive's guard strings as Python source.
    return ExportedModel(program.module(check_guards=False), batch_size), meta


def _load_torchscript(path: Path, map_location: Any) -> tuple[nn.Module, dict[str, Any]]:
    extra = {_TS_META: ""}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.jit is deprecated, still loads
        model = torch.jit.load(str(path), map_location=map_location, _extra_files=extra)
    meta: dict[str, Any] = {}
    if extra[_TS_META]:
        try:
            meta = dict(json.loads(extra[_TS_META]))
        except (ValueError, TypeError):
            meta = {}
    meta["format"] = "torchscript"
    return model, meta


def _load_torch_save(path: Path, map_location: Any, allow_pickle: bool) -> tuple[nn.Module, dict[str, Any]]:
    try:
        obj = torch_load(
            path, allow_pickle=allow_pickle, error=CheckpointError, advice=SAFE_SAVE, map_location=map_location
        )
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{path}: not a model file ({type(exc).__name__}: {first_line(exc)})") from None
    if isinstance(obj, dict) and obj.get("format") == FORMAT:
        return _rebuild(path, check_version(path, obj))
    if isinstance(obj, nn.Module):
        return obj, {"format": "pickled module"}
    if isinstance(obj, dict) and obj and all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(
            f"{path}: holds a bare state_dict, which does not say which architecture it belongs to; ",
            Phrase(
                "fix",
                python="build the model and call model.load_state_dict(torch.load(path)), or save it with "
                "probust.models.save_checkpoint",
                shell=f"give the function that builds the model as --model package.module:function and {path} as "
                "--weights",
            ),
        )
    raise CheckpointError(f"{path}: holds a {type(obj).__name__}, not a model")


def _rebuild(path: Path, payload: dict[str, Any]) -> tuple[nn.Module, dict[str, Any]]:
    meta = dict(payload["meta"])
    try:
        model = build(meta["arch"], meta["num_classes"], meta["input_shape"], **meta.get("arch_kwargs", {}))
    except KeyError as exc:
        raise CheckpointError(f"{path}: checkpoint meta lacks {exc}") from None
    try:
        model.load_state_dict(payload["state_dict"])
    except RuntimeError as exc:
        raise CheckpointError(f"{path}: weights do not fit the recorded architecture {meta['arch']!r}: {exc}") from None
    return model, meta


def load_model(
    path: str | os.PathLike,
    map_location: Any = "cpu",
    *,
    expect_arch: str | None = None,
    expect_num_classes: int | None = None,
    expect_input_shape: Sequence[int] | None = None,
    expect_dataset: str | None = None,
    allow_pickle: bool = False,
) -> tuple[nn.Module, dict[str, Any]]:
    """Loads a model for use with the estimators, whatever way it was saved.

    Accepted files, recognised by content (not by name):

    * a probust checkpoint (:func:`save_checkpoint`): the architecture is rebuilt from the meta;
    * a TorchScript archive (``torch.jit.save``); meta from an optional ``probust_meta.json``
      extra file;
    * a ``torch.export`` program (``torch.export.save``, ``.pt2``); meta records the input shape
      and batch size found in the program. An archive holding pickled weights, constants or
      sample inputs, AOTInductor code, or a shape expression that is not arithmetic loads only
      with ``allow_pickle=True`` (:func:`probust._untrusted.check_export_archive`);
    * a pickled ``nn.Module`` (``torch.save(model)``), only with ``allow_pickle=True``.

    Args:
        path: the model file.
        map_location: device for the weights.
        expect_arch, expect_num_classes, expect_input_shape, expect_dataset: refuse a model that
            does not match (see :func:`check_compatible`). For files without recorded metadata,
            class count and input shape are checked by running one zero input through the model.
        allow_pickle: allow files that run code when loaded (pickled objects, and the ``torch.export``
            archives above).

    Returns:
        ``(model, meta)``; the model is in eval mode, maps ``[B, *input_shape]`` to ``[B, C]``.

    Raises:
        FileNotFoundError: no such file.
        CheckpointError: unreadable or not self-describing file, or one that would run code when
            loaded without ``allow_pickle`` (the message names the file and what in it).
        CheckpointMismatchError: the model is not what was expected.
    """
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"no model file at {path}")
    kind = zip_kind(path)
    try:
        if kind == "export":
            model, meta = _load_export(path, allow_pickle)
        elif kind == "torchscript":
            model, meta = _load_torchscript(path, map_location)
        else:
            model, meta = _load_torch_save(path, map_location, allow_pickle)
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(
            f"{path}: cannot load a model from it ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    if isinstance(map_location, (str, torch.device)):
        model.to(map_location)  # rebuilt and exported models start on the CPU
    model.eval()
    if _describes_model(meta):
        check_compatible(
            meta,
            arch=expect_arch,
            num_classes=expect_num_classes,
            input_shape=expect_input_shape,
            dataset=expect_dataset,
            source=str(path),
        )
    else:
        _probe(model, meta, path, expect_arch, expect_num_classes, expect_input_shape, expect_dataset)
    return model, meta


def _describes_model(meta: dict[str, Any]) -> bool:
    """True when ``meta`` describes the model fully (probust checkpoints, annotated TorchScript)."""
    return all(k in meta for k in ("arch", "num_classes", "input_shape"))


def _probe(
    model: nn.Module,
    meta: dict[str, Any],
    path: Path,
    arch: str | None,
    num_classes: int | None,
    input_shape: Sequence[int] | None,
    dataset: str | None,
) -> None:
    check_compatible(meta, arch=arch, dataset=dataset, source=str(path))
    if input_shape is not None and "input_shape" in meta:
        check_compatible(meta, input_shape=input_shape, source=str(path))
    if num_classes is None and input_shape is None:
        return
    shape = input_shape if input_shape is not None else meta.get("input_shape")
    if shape is None:
        raise CheckpointMismatchError(
            f"{path}: records no input shape, so its class count cannot be checked; pass expect_input_shape"
        )
    device = next((t.device for t in model.parameters()), None) if hasattr(model, "parameters") else None
    x = torch.zeros((2, *[int(s) for s in shape]), device=device)
    try:
        with torch.no_grad():
            out = model(x)
    except Exception as exc:
        problem = _inputs.points_problem(model, x.shape)  # what its first layer does not take
        cause = f": {problem}" if problem is not None else ""
        raise CheckpointMismatchError(
            f"{path}: does not accept inputs of shape {list(shape)}{cause} ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    if not isinstance(out, Tensor) or out.ndim != 2:
        desc = list(out.shape) if isinstance(out, Tensor) else type(out).__name__
        raise CheckpointMismatchError(f"{path}: outputs {desc}, expected logits of shape [batch, classes]")
    if num_classes is not None and out.shape[1] != num_classes:
        raise CheckpointMismatchError(f"{path} mismatch: num_classes is {out.shape[1]}, expected {num_classes}")
