"""Models from the user's own code: a factory ``package.module:function`` and a state_dict file,
and the check that a model's output is logits."""

from __future__ import annotations

import importlib
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from torch import Tensor, nn

from probust import _user_model
from probust._untrusted import torch_load
from probust.errors import first_line
from probust.models._checkpoint import CheckpointError

#: ``package.module:function`` (dotted names on both sides).
FACTORY_PATTERN = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")


def is_factory(spec: str | os.PathLike) -> bool:
    """Whether ``spec`` reads as ``package.module:function`` rather than a file."""
    text = os.fspath(spec)
    return bool(FACTORY_PATTERN.match(text)) and not Path(text).exists()


def build_from_factory(spec: str, kwargs: Mapping[str, Any] | None = None) -> nn.Module:
    """Import ``package.module`` and call ``function(**kwargs)``; it must return an ``nn.Module``.
    The current folder is searched first for the module (as ``python -m`` does).

    Args:
        spec: ``"package.module:function"``, e.g. ``"torchvision.models:resnet18"``.
        kwargs: the function's keyword arguments, e.g. ``{"num_classes": 3}`` (None: none).

    Raises:
        CheckpointError: the module or function cannot be found, the call fails or returns
            something else than an ``nn.Module`` (the message says which).
    """
    module_name, _, attr = spec.partition(":")
    added = os.getcwd() not in sys.path
    if added:
        sys.path.insert(0, os.getcwd())
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise CheckpointError(
            f"{spec}: cannot import {module_name} ({type(exc).__name__}: {first_line(exc)})"
        ) from None
    finally:
        if added:
            sys.path.remove(os.getcwd())
    target: Any = module
    for part in attr.split("."):
        if not hasattr(target, part):
            raise CheckpointError(f"{spec}: {module_name} has no attribute {attr!r}")
        target = getattr(target, part)
    if not callable(target):
        raise CheckpointError(f"{spec}: {attr} is a {type(target).__name__}, not a function")
    kwargs = dict(kwargs or {})
    call = f"{attr}({', '.join(f'{k}={v!r}' for k, v in kwargs.items())})"
    try:
        model = target(**kwargs)
    except Exception as exc:
        raise CheckpointError(f"{spec}: calling {call} failed ({type(exc).__name__}: {first_line(exc)})") from None
    if not isinstance(model, nn.Module):
        raise CheckpointError(f"{spec}: {call} returned a {type(model).__name__}, expected a torch.nn.Module")
    return model


def load_weights(model: nn.Module, path: str | os.PathLike, *, allow_pickle: bool = False) -> None:
    """Load a state_dict file (``torch.save(model.state_dict(), path)``) into ``model`` (strict).

    A probust checkpoint's weights are accepted too. The file is read with ``weights_only=True``
    (:func:`probust._untrusted.torch_load`): one holding pickled Python objects loads only with
    ``allow_pickle``.

    Raises:
        CheckpointError: no such file, not a state_dict, keys/shapes that do not fit the model, or
            pickled objects without ``allow_pickle``.
    """
    p = Path(path)
    if not p.is_file():
        raise CheckpointError(f"{p}: no weights file there")
    try:
        obj = torch_load(
            p,
            allow_pickle=allow_pickle,
            error=CheckpointError,
            advice="save the weights alone: torch.save(model.state_dict(), path)",
        )
    except CheckpointError:
        raise
    except Exception as exc:
        raise CheckpointError(f"{p}: not a state_dict file ({type(exc).__name__}: {first_line(exc)})") from None
    if isinstance(obj, dict) and isinstance(obj.get("state_dict"), dict):
        obj = obj["state_dict"]
    if not isinstance(obj, dict) or not all(isinstance(v, Tensor) for v in obj.values()):
        raise CheckpointError(f"{p}: holds a {type(obj).__name__}, expected a state_dict (names -> tensors)")
    try:
        model.load_state_dict(obj)
    except RuntimeError as exc:
        text = " ".join(str(exc).split())
        raise CheckpointError(f"{p}: the weights do not fit the model: {text[:300]}") from None


def output_problem(out: Any, batch: int) -> str | None:
    """What is wrong with a model's output for a batch of ``batch`` inputs, and what to do; None
    when the model contract reads logits ``[batch, C]`` from it: logits, a Hugging Face
    ``ModelOutput`` (its ``.logits``) or a tuple whose first item is the logits
    (:func:`probust._user_model.output_problem`, which the estimators apply too)."""
    return _user_model.output_problem(out, batch)
